// The products of one chunk step of a fused GDN prefill kernel shaped like FlashInfer's SM90 one
// (docs/kernels/gdn.md, "What a fused kernel would have to keep"), on wgmma, to time what they
// cost before such a kernel is written: benchmarks/gdn_wgmma_chunk.py. Not a GDN kernel: no loads
// from global memory in the loop, no intra-chunk solve, no gates but one decay; the same operand
// tiles every chunk. What it keeps of the fused kernel: a block per (sequence, value head), two
// warpgroups that each hold 64 of the state's 128 value rows ([V, K], K = 128) in wgmma
// accumulators for the whole sequence, and a chunk's five products with register A operands:
//   o  = S Bq            (S Q^T: o's inter-chunk part; Bq = Q^T, K x C)
//   x  = -(S Bk)         (S K^T, as in V - S K^T; Bk = K^T)
//   nv = x Bt            ((V - S K^T) T^T; Bt = T^T, C x C)
//   o += nv Bp           (the intra-chunk part; Bp, C x C)
//   S  = d S + nv Bk2    (the update; Bk2 = K, C x K)
// C = 64 positions a chunk. B tiles in shared memory, K-major with the 128-byte swizzle (one
// descriptor a 32-byte k step). KIND 0: tf32 operands (A rounded to nearest tf32 with cvt.rna;
// B as given, the tensor cores truncate), m64nNk8; KIND 1: bf16 operands (A packed to bf16 from the
// float32 accumulators, B in bf16), m64nNk16, as FlashInfer rounds; KIND 2: bf16 operands in two
// halves where they are not bf16 already (twelve bf16 products a chunk; see the kernel). The final S and the last
// chunk's o go to global memory so that a test can check the products against float64.
//
// tf32 A operands come straight from accumulators: accumulator register 4 j + e of lane (g, t)
// holds column 8 j + 2 t + e % 2 (row g or g + 8), tf32's A fragment wants k = t and t + 4 of
// the k step; so the lane gives column 2 t as k t and 2 t + 1 as k t + 4, and B's shared-memory
// rows hold k in that order (physical k 2 l <- logical l, 2 l + 1 <- l + 4, in each group of 8:
// kperm below). bf16's A fragment matches the accumulators' pairs as they are.
#include <stdint.h>
#include <string.h>

#ifdef WB_MMA_EMU
// the host emulation (kernels/gdn/gdn_wgmma_chunk_emu.cpp): the same kernel on the CPU, for tests
#include "common/cuda_emu.h"
#define WB_SMEM_DECL(name) WB_DYNAMIC_SMEM(uint8_t, name)
#else
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#define WB_LAUNCH(g, b, m, s, ...) __VA_ARGS__<<<g, b, m, s>>>
#define WB_SMEM_DECL(name) extern __shared__ __align__(16) uint8_t name[]
#endif

#include "common/mma_ops.h"
#include "common/wgmma_tiles.h"

namespace {

constexpr int kC = 64, kK = 128, kThreads = 256;
using namespace wbtile;

// math B (KC x N, row-major float32) into its tile at smem byte offset base (1024-aligned); bf16
// kinds: B rounded to bf16, or (LO) what that rounding left, B - bf16(B), rounded to bf16
template <int KIND, bool LO = false>
__device__ void place(uint8_t* sm, uint32_t base, const float* B, int KC, int N) {
  for (int i = threadIdx.x; i < KC * N; i += blockDim.x) {
    const int p = i / N, n = i % N;
    if constexpr (KIND == 0) {
      *reinterpret_cast<float*>(sm + base + b_offset<4>(kperm(p), n, N)) = B[i];
    } else {
      const __nv_bfloat16 hi = __float2bfloat16_rn(B[i]);
      *reinterpret_cast<__nv_bfloat16*>(sm + base + b_offset<2>(p, n, N)) =
          LO ? __float2bfloat16_rn(B[i] - __bfloat162float(hi)) : hi;
    }
  }
}



// tiles: Bq (K x C: 64 rows of n, 128 of k), Bk (same), Bt (C x C), Bp (C x C), Bk2 (C x K: 128
// rows of n, 64 of k); block b runs `chunks` steps from S0's rows of its own (the same for all
// blocks) and writes S (128 x 128) and the last o (128 x 64) for block 0
// the shared memory of KIND's tiles: Bq, Bk, Bt, Bp, Bk2 (and KIND 2: Bt's and Bp's low halves)
template <int KIND>
constexpr int tiles_bytes() {
  constexpr int E = KIND == 0 ? 4 : 2;
  return 2 * tile_bytes<E>(kC, kK) + (KIND == 2 ? 4 : 2) * tile_bytes<E>(kC, kC) + tile_bytes<E>(kK, kC);
}

// KIND 2: bf16 operands split in two halves (hi = bf16(x), lo = bf16(x - hi)) where they are not
// bf16 already: A always (S, x, nv come from float32 accumulators); B for Bt and Bp (the chunk's
// T and P are float32 in a GDN kernel), not for Bq, Bk, Bk2 (q and k are bf16 inputs, exact).
// Products: A B as hi B + lo B, or hi Bhi + hi Blo + lo Bhi (the model's `fused-x2s`: twelve bf16
// products a chunk instead of five).
template <int KIND>
__global__ void __launch_bounds__(kThreads, 1)
wgmma_chunk(const float* Bq, const float* Bk, const float* Bt, const float* Bp, const float* Bk2,
            const float* S0, float decay, int chunks, float* S_out, float* o_out) {
  WB_SMEM_DECL(smraw);
  constexpr bool X2 = KIND == 2;
  constexpr int MK = X2 ? 1 : KIND, E = KIND == 0 ? 4 : 2;  // the mma's kind, an element's bytes
  const uint32_t sa0 = wbmma::smem_u32(smraw), pad = (1024 - sa0 % 1024) % 1024;
  uint8_t* sm = smraw + pad;
  const uint32_t q = 0, k = q + tile_bytes<E>(kC, kK), t = k + tile_bytes<E>(kC, kK),
                 p = t + tile_bytes<E>(kC, kC), k2 = p + tile_bytes<E>(kC, kC),
                 tl = k2 + tile_bytes<E>(kK, kC), pl = tl + tile_bytes<E>(kC, kC);
  place<MK>(sm, q, Bq, kK, kC);
  place<MK>(sm, k, Bk, kK, kC);
  place<MK>(sm, t, Bt, kC, kC);
  place<MK>(sm, p, Bp, kC, kC);
  place<MK>(sm, k2, Bk2, kC, kK);
  if constexpr (X2) {
    place<MK, true>(sm, tl, Bt, kC, kC);
    place<MK, true>(sm, pl, Bp, kC, kC);
  }
  wbmma::fence_async_smem();
  __syncthreads();
  const uint32_t sb = sa0 + pad;
  const int tid = threadIdx.x, wg = tid / 128, w = (tid % 128) / 32, g = (tid % 32) / 4, tq = tid % 4;
  auto row = [&](int i) { return 64 * wg + 16 * w + g + 8 * ((i / 2) % 2); };
  auto col = [&](int i) { return 8 * (i / 4) + 2 * tq + i % 2; };
  float s[2][32], o[32], x[32], nv[32];
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int i = 0; i < 32; ++i) s[h][i] = S0[row(i) * kK + 64 * h + col(i)];
  auto fence_all = [&]() {
    fence_regs(s[0]), fence_regs(s[1]), fence_regs(o), fence_regs(x), fence_regs(nv);
  };
  constexpr int SK = kK / (MK == 0 ? 8 : 16), SC = kC / (MK == 0 ? 8 : 16);  // k steps
  uint32_t as[SK][4], ax[SC][4];
  uint32_t asl[X2 ? SK : 1][4], axl[X2 ? SC : 1][4];  // the low halves (KIND 2)
  for (int c = 0; c < chunks; ++c) {
    // o = S Bq and x = S Bk, both from S's fragments
    frags<MK, 64>(s[0], as);
    frags<MK, 64>(s[1], as, SK / 2);
    if constexpr (X2) frags_lo<64>(s[0], asl), frags_lo<64>(s[1], asl, SK / 2);
#pragma unroll
    for (int i = 0; i < 32; ++i) o[i] = x[i] = 0.0f;
    fence_all();
    wbmma::wgmma_fence();
    product<MK, kK>(o, as, sb + q, kC, 0, false);
    product<MK, kK>(x, as, sb + k, kC, 0, false);
    if constexpr (X2) {
      product<MK, kK>(o, asl, sb + q, kC, 0, true);
      product<MK, kK>(x, asl, sb + k, kC, 0, true);
    }
    wbmma::wgmma_commit();
    wbmma::wgmma_wait<0>();
    fence_all();
    // nv = -x Bt
#pragma unroll
    for (int i = 0; i < 32; ++i) x[i] = -x[i], nv[i] = 0.0f;
    frags<MK, kC>(x, ax);
    if constexpr (X2) frags_lo<kC>(x, axl);
    fence_all();
    wbmma::wgmma_fence();
    product<MK, kC>(nv, ax, sb + t, kC, 0, false);
    if constexpr (X2) {
      product<MK, kC>(nv, ax, sb + tl, kC, 0, true);
      product<MK, kC>(nv, axl, sb + t, kC, 0, true);
    }
    wbmma::wgmma_commit();
    wbmma::wgmma_wait<0>();
    fence_all();
    // o += nv Bp, S = decay S + nv Bk2
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int i = 0; i < 32; ++i) s[h][i] *= decay;
    frags<MK, kC>(nv, ax);
    if constexpr (X2) frags_lo<kC>(nv, axl);
    fence_all();
    wbmma::wgmma_fence();
    product<MK, kC>(o, ax, sb + p, kC, 0, true);
    product<MK, kC>(s[0], ax, sb + k2, kK, 0, true);
    product<MK, kC>(s[1], ax, sb + k2, kK, 64, true);
    if constexpr (X2) {
      product<MK, kC>(o, ax, sb + pl, kC, 0, true);
      product<MK, kC>(o, axl, sb + p, kC, 0, true);
      product<MK, kC>(s[0], axl, sb + k2, kK, 0, true);
      product<MK, kC>(s[1], axl, sb + k2, kK, 64, true);
    }
    wbmma::wgmma_commit();
    wbmma::wgmma_wait<0>();
    fence_all();
  }
  if (blockIdx.x == 0) {
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      S_out[row(i) * kK + col(i)] = s[0][i];
      S_out[row(i) * kK + 64 + col(i)] = s[1][i];
      o_out[row(i) * kC + col(i)] = o[i];
    }
  }
}

template <int KIND>
int run(int blocks, const float* Bq, const float* Bk, const float* Bt, const float* Bp, const float* Bk2,
        const float* S0, float decay, int chunks, float* S_out, float* o_out, cudaStream_t s) {
  const int bytes = tiles_bytes<KIND>() + 1024;
  cudaError_t e = cudaFuncSetAttribute(wgmma_chunk<KIND>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e != cudaSuccess) return (int)e;
  WB_LAUNCH(blocks, kThreads, bytes, s, wgmma_chunk<KIND>)(Bq, Bk, Bt, Bp, Bk2, S0, decay, chunks, S_out, o_out);
  return (int)cudaGetLastError();
}

}  // namespace

extern "C" {

// kind 0 tf32, 1 bf16, 2 bf16 in two halves: `blocks` blocks of `chunks` chunk steps each (device pointers; see the
// kernel); a CUDA status (asynchronous on stream)
int wgmma_chunk_run(int kind, int blocks, const float* Bq, const float* Bk, const float* Bt, const float* Bp,
                    const float* Bk2, const float* S0, float decay, int chunks, float* S_out, float* o_out,
                    void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (kind == 0) return run<0>(blocks, Bq, Bk, Bt, Bp, Bk2, S0, decay, chunks, S_out, o_out, s);
  if (kind == 1) return run<1>(blocks, Bq, Bk, Bt, Bp, Bk2, S0, decay, chunks, S_out, o_out, s);
  if (kind == 2) return run<2>(blocks, Bq, Bk, Bt, Bp, Bk2, S0, decay, chunks, S_out, o_out, s);
  return -1;
}

}  // extern "C"
