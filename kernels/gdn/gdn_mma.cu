// Tensor-core chunked prefill of GDN (the CUDA build's "mma" path, for bf16/fp16 inputs).
//
// Same chunked UT/WY algebra as gdn_common.h (chunk C = 64, gc the within-chunk cumulative log
// decay, A[i][j] = beta_i (k_i . k_j) exp(gc_i - gc_j) for j < i), in two launches whose matrix
// products run on tensor cores: mma.sync m16n8k8 with tf32 operands and fp32 accumulators. Every
// operand is the float32 value rounded once to nearest tf32 (cvt.rna, 10-bit mantissa): raw keys
// and queries when they are read (at the fragment load), and the kernels' own products (A, the
// inverse diagonal blocks, the substitution's intermediates, Tinv, P, PT, R, the decayed U of the
// update, the state as an operand) when they are written. tf32 keeps that rounding (2^-11
// relative) well below the bf16 rounding of the inputs (2^-8); sums, decays, the state itself and
// V - exp(gc) K S stay in float32.
//   1. prepare, one block per (b, key head, chunk), all in parallel: K K^T and Q K^T by mma once,
//      then for each value head of the key head A; the 16 x 16 diagonal blocks of (I + A)^-1 in
//      float32 (gdn_mma.h); Tinv = (I + A)^-1 by blocked forward substitution with mma;
//      P = (Q K^T) * exp(gc_i - gc_j) and PT = P Tinv by mma.
//   2. pass, one block of 8 warps per (b, hv, 32 value columns; 16 on small grids: `smem16`),
//      sequential over chunks, or the warp-resident pass (the state of 16 columns a warp): the
//      state tile lives in mma accumulators; per chunk R = beta (V - exp(gc) K S), U = Tinv R,
//      o = scale (exp(gc) Q S + PT R) and S <- exp(gc_last) S + K^T (exp(gc_last - gc_j) U_j);
//      the next chunk's inputs are copied into shared memory (cp.async) while this one computes,
//      by warps launched only for the copies (two with the shared-memory pass, one with the
//      warp-resident pass below 8 warps; WORKBENCH_GDN_MMA_COPY).
// The kernels are templated on K (and the element type) so that tile strides and loop bounds are
// constants: fragment addresses are then a base register plus immediates. Within each k-step of 8, slot t
// of the fragments holds k = 2t and slot t + 4 holds k = 2t + 1 (any pairing of k with slots
// gives the same product), so operands stored with k contiguous load as 8-byte pairs; tile row
// strides are 8 mod 32 floats for those and 4 mod 16 for operands read across k rows, which
// keeps the loads free of bank conflicts (bf16 / fp16 tiles: strides 8 mod 64 elements, pairs
// loaded as 4 bytes). Raw bf16 / fp16 keys and queries mostly reach the fragments by ldmatrix
// (two k-steps of a 16-row block, or of two n-tiles, a load; transposed where a product reads
// them across rows), each 32-bit pair then split into two tf32 operands: the same operands, in
// the same order, as the pair loads. The kernels are issue-bound (ncu), so the instructions
// around the mma count: the stage copies step one address a thread by constants, the
// shared-memory pass's products over a triangle's run-time depth are unrolled behind
// warp-uniform tests, o's element type is one branch outside the store loops
// (benchmarks/gdn_sass_mix.py counts them).
// q, k, v are read as float32 or, as the caller gave them, bf16 / fp16 (each kernel is templated
// on that type, QT): a 16-bit value is exact in tf32, so the result is the same bit for bit as
// with the values widened to float32 first, for half the bytes of q, k and v where they are read.
// qk_l2norm: a third launch computes each q and k row's factor 1 / sqrt(sum x^2 + 1e-6) (nq,
// nk), and the kernels fold them into the products they form from the raw q and k (A, P, K S,
// Q S, the state update's keys), so q and k keep their 16-bit reads;
// without a norm the factors are 1 and every product is unchanged bit for bit.
// Packed (varlen) batches: B = 1 with the sequences' token offsets; one launch of prepare and one
// of the pass per 128 sequences, the offsets passed by value (Packed): prepare has a block per
// chunk and head over all the launch's sequences, each chunked from its own first token, and the
// pass a block per sequence, head and column group, with the sequence's own state; a sequence's
// arithmetic is that of the sequence alone on the same pass.
// Workspace (float32, GdnArgs.tinv): [B,HV,NC,kChunkWs], each chunk's Tinv and PT (64 x 64 each)
// and the passes' per-position factors (exp(gc) nk, exp(gc) nq, beta, exp(gc_last - gc) nk,
// exp(gc_last)), which prepare forms once with the expressions the passes used to form them (from
// the same float32 values: the same bits) so that a pass stages them with Tinv and PT instead of
// the decays, beta and norms with 4-byte copies and three exponentials a position. o is written
// in float32, bf16 or fp16 (rounded to nearest even from the float32 result).
#ifdef WB_MMA_EMU
// the host emulation of the CUDA built-ins and PTX below, for CPU tests (gdn_mma_emu.cpp)
#include "common/cuda_emu.h"
// blocks one after another, kernels one after another: a dependent launch is an ordinary one,
// and its wait and its primary's trigger are nothing
#define WB_LAUNCH_PDL(g, b, m, s, pdl, ...) \
  ([&](auto&&... args) { WB_LAUNCH(g, b, m, s, __VA_ARGS__)(args...); return cudaSuccess; })
inline void launch_dependents() {}
inline void wait_for_primary() {}
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#define WB_LAUNCH(g, b, m, s, ...) __VA_ARGS__<<<g, b, m, s>>>
#define WB_DYNAMIC_SMEM(T, name) extern __shared__ T name[]
// Programmatic dependent launch (the default; WORKBENCH_GDN_MMA_PDL=off for an ordinary launch):
// the pass's blocks may start once every block of prepare has run launch_dependents; its threads
// that read prepare's workspace (those that issue its copies) first run wait_for_primary, which
// returns once prepare has ended and its stores are visible. Without such a launch both are
// nothing.
__device__ __forceinline__ void launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
__device__ __forceinline__ void wait_for_primary() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}
// a launch that may begin before the stream's previous kernel ends (pdl), else an ordinary one
template <typename... P>
struct PdlLaunch {
  void (*kernel)(P...);
  dim3 grid, block;
  size_t smem;
  cudaStream_t stream;
  bool pdl;
  template <typename... A>
  cudaError_t operator()(A&&... args) const {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = stream;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at, cfg.numAttrs = pdl ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kernel, static_cast<P>(args)...);
  }
};
template <typename... P>
PdlLaunch<P...> pdl_launch(void (*k)(P...), dim3 g, dim3 b, size_t m, cudaStream_t s, bool pdl) {
  return PdlLaunch<P...>{k, g, b, m, s, pdl};
}
#define WB_LAUNCH_PDL(g, b, m, s, pdl, ...) pdl_launch(__VA_ARGS__, g, b, m, s, pdl)
#endif
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

#include "common/mma_ops.h"
#include "common/wgmma_tiles.h"
#include "gdn/gdn_abi.h"
#include "gdn/gdn_common.h"
#include "gdn/gdn_mma.h"

namespace {

// Phase clocks (a diagnostic build only: -DWB_GDN_CLOCKS, benchmarks/gdn_clocks.py): lane 0 of
// each warp of every 16th block adds the cycles since its previous mark to a per-(kernel, warp,
// phase) counter (fire-and-forget atomics, so the marks barely move the timing); phase 15 counts
// the iterations marked. Without the flag every mark is nothing.
#if defined(WB_GDN_CLOCKS) && !defined(WB_MMA_EMU)
__device__ unsigned long long wb_clk[3][8][16];
struct Clk {
  long long t;
  bool on;
  int kern, w;
  __device__ Clk(int kern_) : kern(kern_) {
    w = threadIdx.x >> 5;
    on = (threadIdx.x & 31) == 0 && ((blockIdx.x + blockIdx.y) & 15) == 0 && w < 8;
    t = clock64();
  }
  __device__ __forceinline__ void mark(int p) {
    if (on) {
      const long long c = clock64();
      atomicAdd(&wb_clk[kern][w][p], (unsigned long long)(c - t));
      t = c;
    }
  }
  __device__ __forceinline__ void count() {
    if (on) atomicAdd(&wb_clk[kern][w][15], 1ull);
  }
};
#define WB_CLK_INIT(kern) Clk clk_(kern)
#define WB_CLK(p) clk_.mark(p)
#define WB_CLK_COUNT() clk_.count()
#else
#define WB_CLK_INIT(kern)
#define WB_CLK(p)
#define WB_CLK_COUNT()
#endif

constexpr int kC = 64;         // chunk length
constexpr int kPS = kC + 8;    // row stride of the C x C tiles (A, P)
constexpr int kXS = 24;  // of prepare's diagonal inverse blocks, 16 columns (-8 mod 32: kPS's banks)
constexpr int kThreads = 256;  // every kernel: 8 warps
// A chunk's workspace from prepare (floats): Tinv and PT (64 x 64 each, tf32), then the passes'
// per-position factors, kC each (kFac): exp(gc_i) nk_i, exp(gc_i) nq_i, beta_i,
// exp(gc_last - gc_i) nk_i (0 past the chunk's end) and exp(gc_last) (element 0 of the fifth row).
constexpr int kFacRows = 5, kFac = 2 * kC * kC, kChunkWs = kFac + kFacRows * kC;

__device__ __forceinline__ uint32_t tf32_bits(float x) {
  const uint32_t r = wbmma::tf32_rna(x);
#if defined(WB_MMA_EMU) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900)
  return r;  // the model, and sm_90's conversion (its SASS ends in that mask), clear the 13 low bits
#else
  return r & 0xffffe000u;
#endif
}
// x rounded to nearest tf32 (ties away from zero), as a float
__device__ __forceinline__ float rtf32(float x) { return __uint_as_float(tf32_bits(x)); }

template <bool CVT>
__device__ __forceinline__ uint32_t opnd(float x) {
  if constexpr (CVT) {
    return wbmma::tf32_rna(x);
  } else {
    return __float_as_uint(x);
  }
}

// Elements of the staged inputs q, k, v: float32, or bf16 / fp16 as the caller gave them (exact
// in tf32: nothing to round at the fragment loads). Scalar and pair reads, widened to float.
__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float2 ld2(const float* p) {
  return *reinterpret_cast<const float2*>(p);
}
__device__ __forceinline__ float2 ld2(const __nv_bfloat16* p) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
}
__device__ __forceinline__ float2 ld2(const __half* p) {
  return __half22float2(*reinterpret_cast<const __half2*>(p));
}
template <typename T>
constexpr bool is_f32 = std::is_same<T, float>::value;

// o's elements: float32 as computed, bf16 / fp16 rounded to nearest even; pairs (p: 4 or 8 bytes
// aligned).
__device__ __forceinline__ void put(float* p, float x) { *p = x; }
__device__ __forceinline__ void put(__nv_bfloat16* p, float x) { *p = __float2bfloat16_rn(x); }
__device__ __forceinline__ void put(__half* p, float x) { *p = __float2half_rn(x); }
__device__ __forceinline__ void put2(float* p, float x, float y) {
  *reinterpret_cast<float2*>(p) = make_float2(x, y);
}
__device__ __forceinline__ void put2(__nv_bfloat16* p, float x, float y) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(x, y);
}
__device__ __forceinline__ void put2(__half* p, float x, float y) {
  *reinterpret_cast<__half2*>(p) = __floats2half2_rn(x, y);
}
// f(typed o) for o's element type code odt (0 float32, 1 bf16, 2 fp16): one branch, outside the
// stores' loops.
template <typename F>
__device__ __forceinline__ void with_out_type(void* o, int odt, F&& f) {
  if (odt == 1) f(static_cast<__nv_bfloat16*>(o));
  else if (odt == 2) f(static_cast<__half*>(o));
  else f(static_cast<float*>(o));
}

__device__ __forceinline__ void mma8(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                     uint32_t b1) {
  wbmma::tf32_m16n8k8(d, a, b0, b1);
}

// The B fragment of one k-step (p at this lane's element): (k, n) at p[k * BK], pairs where BK
// is 1; CB: round a float32 operand to tf32 here.
template <int BK, bool CB, typename TB>
__device__ __forceinline__ void b_frag(const TB* p, uint32_t& b0, uint32_t& b1) {
  if constexpr (BK == 1) {
    const float2 x = ld2(p);
    b0 = opnd<CB>(x.x);
    b1 = opnd<CB>(x.y);
  } else {
    b0 = opnd<CB>(to_f(p[0]));
    b1 = opnd<CB>(to_f(p[BK]));
  }
}

// One k-step of 8 for one warp. A and B are already offset to this lane's fragment elements and
// to the k-step; (i, k) of A at A[i * AI + k * AK], (k, n) of B at B[k * BK + n * BN]; slot t
// holds k = 2t, slot t + 4 holds k = 2t + 1 (pair loads where AK or BK is 1). CA/CB: round a
// float32 operand to tf32 here (raw float32 in shared memory) rather than rely on it being
// rounded; bf16 / fp16 operands are exact in tf32.
template <int MT, int NT, int AI, int AK, int BK, int BN, bool CA, bool CB, typename TA,
          typename TB>
__device__ __forceinline__ void kstep(float (&acc)[MT][NT][4], const TA* A, const TB* B) {
  constexpr bool ca = CA && is_f32<TA>, cb = CB && is_f32<TB>;
  uint32_t a[MT][4];
#pragma unroll
  for (int m = 0; m < MT; ++m) {
    const TA* p = A + m * 16 * AI;
    if constexpr (AK == 1) {
      const float2 lo = ld2(p);
      const float2 hi = ld2(p + 8 * AI);
      a[m][0] = opnd<ca>(lo.x);
      a[m][2] = opnd<ca>(lo.y);
      a[m][1] = opnd<ca>(hi.x);
      a[m][3] = opnd<ca>(hi.y);
    } else {
      a[m][0] = opnd<ca>(to_f(p[0]));
      a[m][2] = opnd<ca>(to_f(p[AK]));
      a[m][1] = opnd<ca>(to_f(p[8 * AI]));
      a[m][3] = opnd<ca>(to_f(p[8 * AI + AK]));
    }
  }
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    uint32_t b0, b1;
    b_frag<BK, cb>(B + n * 8 * BN, b0, b1);
#pragma unroll
    for (int m = 0; m < MT; ++m) mma8(acc[m][n], a[m], b0, b1);
  }
}

// One warp: acc[m][n] += A[16m.., 0:KD] B[0:KD, 8n..], A and B pointing at the warp's tile origin.
// Fragment element r of acc[m][n] is row 16m + g + 8 (r / 2), column 8n + 2t + (r % 2) of the
// tile, g = lane / 4, t = lane % 4.
template <int MT, int NT, int KD, int AI, int AK, int BK, int BN, bool CA = false, bool CB = false,
          typename TA, typename TB>
__device__ __forceinline__ void gemm(float (&acc)[MT][NT][4], const TA* A, const TB* B,
                                     int lane) {
  const int g = lane >> 2, t = lane & 3;
  A += g * AI + 2 * t * AK;
  B += 2 * t * BK + g * BN;
#pragma unroll
  for (int k0 = 0; k0 < KD; k0 += 8)
    kstep<MT, NT, AI, AK, BK, BN, CA, CB>(acc, A + k0 * AK, B + k0 * BK);
}

// The same over a depth kd known at run time (a multiple of 8), operands already rounded.
template <int MT, int NT, int AI, int AK, int BK, int BN>
__device__ __forceinline__ void gemm_to(float (&acc)[MT][NT][4], const float* A, const float* B,
                                        int kd, int lane) {
  const int g = lane >> 2, t = lane & 3;
  A += g * AI + 2 * t * AK;
  B += 2 * t * BK + g * BN;
#pragma unroll 2
  for (int k0 = 0; k0 < kd; k0 += 8)
    kstep<MT, NT, AI, AK, BK, BN, false, false>(acc, A + k0 * AK, B + k0 * BK);
}

// Two products sharing the B operand: acc1 += A1 B and acc2 += A2 B over depth kd (a multiple of
// 8; KD when known at compile time, else kd), one warp, 16 rows of each A, operands already
// exact in tf32 or rounded at the load (CA: float32 A; CB: float32 B), B's fragments loaded once.
// TWO = false: acc1 += A1 B alone (acc2 and A2 unused; gemm_one), the same products and order.
template <int NT, int KD, int AI, int AK, int BK, int BN, bool CA, bool CB, bool TWO = true,
          typename TA, typename TB>
__device__ __forceinline__ void gemm_pair(float (&acc1)[1][NT][4], float (&acc2)[1][NT][4],
                                          const TA* A1, const TA* A2, const TB* B, int kd,
                                          int lane) {
  const int g = lane >> 2, t = lane & 3;
  A1 += g * AI + 2 * t * AK;
  A2 += g * AI + 2 * t * AK;
  B += 2 * t * BK + g * BN;
  constexpr bool ca = CA && is_f32<TA>, cb = CB && is_f32<TB>;
  auto step = [&](int k0) {
    uint32_t a1[4], a2[4];
    const TA* p1 = A1 + k0 * AK;
    const TA* p2 = A2 + k0 * AK;
    static_assert(AK == 1, "A rows with k contiguous");
    const float2 l1 = ld2(p1), h1 = ld2(p1 + 8 * AI);
    a1[0] = opnd<ca>(l1.x); a1[2] = opnd<ca>(l1.y); a1[1] = opnd<ca>(h1.x); a1[3] = opnd<ca>(h1.y);
    if constexpr (TWO) {
      const float2 l2 = ld2(p2), h2 = ld2(p2 + 8 * AI);
      a2[0] = opnd<ca>(l2.x); a2[2] = opnd<ca>(l2.y); a2[1] = opnd<ca>(h2.x); a2[3] = opnd<ca>(h2.y);
    }
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      uint32_t b0, b1;
      b_frag<BK, cb>(B + k0 * BK + n * 8 * BN, b0, b1);
      mma8(acc1[0][n], a1, b0, b1);
      if constexpr (TWO) mma8(acc2[0][n], a2, b0, b1);
    }
  };
  if constexpr (KD > 0) {
#pragma unroll
    for (int k0 = 0; k0 < KD; k0 += 8) step(k0);
  } else {  // kd <= kC: unrolled, each k-step behind a test (warp-uniform), constant offsets
#pragma unroll
    for (int k0 = 0; k0 < kC; k0 += 8)
      if (k0 < kd) step(k0);
  }
}

// acc += A B alone: gemm_pair's single product (the same operands, products and order).
template <int NT, int KD, int AI, int AK, int BK, int BN, bool CA, bool CB, typename TA,
          typename TB>
__device__ __forceinline__ void gemm_one(float (&acc)[1][NT][4], const TA* A, const TB* B, int kd,
                                         int lane) {
  gemm_pair<NT, KD, AI, AK, BK, BN, CA, CB, false>(acc, acc, A, A, B, kd, lane);
}

template <int N>
__device__ __forceinline__ void zero1(float (&acc)[N][4]) {
#pragma unroll
  for (int n = 0; n < N; ++n)
#pragma unroll
    for (int r = 0; r < 4; ++r) acc[n][r] = 0.f;
}

template <int MT, int NT>
__device__ __forceinline__ void zero(float (&acc)[MT][NT][4]) {
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[m][n][r] = 0.f;
}

#ifdef WB_MMA_EMU
__device__ __forceinline__ void cp_commit() { wbemu::cp_async_commit(); }
template <int N>
__device__ __forceinline__ void cp_wait() { wbemu::cp_async_wait(N); }
// bar.sync id, n: the n threads (whole warps) that use barrier id meet (ID: known at compile time)
template <int N>
__device__ __forceinline__ void named_sync(int id) { wbemu::named_barrier(id, N); }
template <int ID, int N>
__device__ __forceinline__ void named_sync() { wbemu::named_barrier(ID, N); }
// bar.arrive id, n: this thread's arrival at barrier id, without waiting (a producer's signal)
template <int N>
__device__ __forceinline__ void named_arrive(int id) { wbemu::named_arrive(id, N); }
#else
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }
template <int N>
__device__ __forceinline__ void named_sync(int id) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "n"(N) : "memory");
}
template <int ID, int N>
__device__ __forceinline__ void named_sync() {
  asm volatile("bar.sync %0, %1;" ::"n"(ID), "n"(N) : "memory");
}
template <int N>
__device__ __forceinline__ void named_arrive(int id) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "n"(N) : "memory");
}
#endif

// Four 8 x 8 tiles of 16-bit elements from shared memory (ldmatrix; lane l gives the row
// address of tile l / 8, row l % 8, 16 bytes each): r[m] holds this lane's pair of tile m, row
// lane / 4, elements 2 (lane % 4) and 2 (lane % 4) + 1 (TRANS: of the transposed tile).
template <bool TRANS>
__device__ __forceinline__ void ldsm4(uint32_t (&r)[4], const void* row) {
#ifdef WB_MMA_EMU
  wbemu::ldmatrix_x4<TRANS>(r, row);
#else
  const unsigned a = (unsigned)__cvta_generic_to_shared(row);
  if constexpr (TRANS)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
#endif
}
// A pair of bf16 / fp16 values (low half first) as two tf32 operands (exact).
template <typename T>
__device__ __forceinline__ void split16(uint32_t r, uint32_t& lo, uint32_t& hi) {
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    lo = r << 16;
    hi = r & 0xffff0000u;
  } else {
    lo = __float_as_uint(__half2float(__ushort_as_half((unsigned short)(r & 0xffffu))));
    hi = __float_as_uint(__half2float(__ushort_as_half((unsigned short)(r >> 16))));
  }
}

// The A fragment of k-step h (0 or 1) of an ldmatrix.x4 load of a 16 x 16 block of 16-bit values
// (registers 2h: rows g, 2h + 1: rows g + 8, each a k pair), as tf32 operands (exact): slot t
// holds k = 2t, slot t + 4 holds k = 2t + 1, as every fragment here.
template <typename T>
__device__ __forceinline__ void a_frag16(const uint32_t (&r)[4], int h, uint32_t (&a)[4]) {
  split16<T>(r[2 * h], a[0], a[2]);
  split16<T>(r[2 * h + 1], a[1], a[3]);
}

// gemm_pair over a depth KD (a multiple of 16) for 16-bit A operands with k contiguous (row
// stride AI elements): each A's fragments of two k-steps by one ldmatrix (lane l gives the
// address of row l % 16, k 8 (l / 16) of the 16 x 16 block), split into tf32 operands (exact);
// B float32 in shared memory as in gemm_pair (BK = 1: pairs; operands already exact in tf32).
// The same products, operands and order as gemm_pair's.
// TWO = false: acc1 += A1 B alone (gemm_one16).
template <int NT, int KD, int AI, int BN, bool TWO = true, typename TA>
__device__ __forceinline__ void gemm_pair16(float (&acc1)[1][NT][4], float (&acc2)[1][NT][4],
                                            const TA* A1, const TA* A2, const float* B,
                                            int lane) {
  static_assert(KD % 16 == 0 && !is_f32<TA>, "16-bit A, k-steps in pairs");
  const int g = lane >> 2, t = lane & 3, ao = (lane & 15) * AI + 8 * (lane >> 4);
  B += 2 * t + g * BN;
#pragma unroll
  for (int k0 = 0; k0 < KD; k0 += 16) {
    uint32_t r1[4], r2[4];
    ldsm4<false>(r1, A1 + ao + k0);
    if constexpr (TWO) ldsm4<false>(r2, A2 + ao + k0);
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // k-steps k0 and k0 + 8
      uint32_t a1[4], a2[4];
      a_frag16<TA>(r1, h, a1);
      if constexpr (TWO) a_frag16<TA>(r2, h, a2);
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        const float2 x = ld2(B + k0 + 8 * h + n * 8 * BN);
        mma8(acc1[0][n], a1, __float_as_uint(x.x), __float_as_uint(x.y));
        if constexpr (TWO) mma8(acc2[0][n], a2, __float_as_uint(x.x), __float_as_uint(x.y));
      }
    }
  }
}
template <int NT, int KD, int AI, int BN, typename TA>
__device__ __forceinline__ void gemm_one16(float (&acc)[1][NT][4], const TA* A, const float* B,
                                           int lane) {
  gemm_pair16<NT, KD, AI, BN, false>(acc, acc, A, A, B, lane);
}

// gemm<1, NT, KD, 1, AK, ...> for a 16-bit A stored transposed (A(i, k) at A[k * AK + i], i
// contiguous): the fragments of two k-steps by one transposing ldmatrix (lane l gives the
// address of k = (l % 8) + 8 (l / 16), i = 8 ((l / 8) % 2)), split into tf32 operands (exact);
// B float32, (k, n) at B[k + n * BN] (pairs). The same products, operands and order as gemm's.
template <int NT, int KD, int AK, int BN, typename TA>
__device__ __forceinline__ void gemm16t(float (&acc)[1][NT][4], const TA* A, const float* B,
                                       int lane) {
  static_assert(KD % 16 == 0 && !is_f32<TA>, "16-bit A, k-steps in pairs");
  const int g = lane >> 2, t = lane & 3;
  A += ((lane & 7) + 8 * (lane >> 4)) * AK + 8 * ((lane >> 3) & 1);
  B += 2 * t + g * BN;
#pragma unroll
  for (int k0 = 0; k0 < KD; k0 += 16) {
    uint32_t r[4];
    ldsm4<true>(r, A + k0 * AK);
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // k-steps k0 and k0 + 8
      uint32_t a[4];
      a_frag16<TA>(r, h, a);
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        const float2 x = ld2(B + k0 + 8 * h + n * 8 * BN);
        mma8(acc[0][n], a, __float_as_uint(x.x), __float_as_uint(x.y));
      }
    }
  }
}

// gemm<1, NT, KD, AI, 1, 1, BN> for 16-bit operands: A's rows k-contiguous (stride AI) and B
// given as its columns' rows, k-contiguous ((k, n) at B[n * BN + k], as keys are for Q K^T).
// Fragments of two k-steps by ldmatrix, A's 16 x 16 block in one (lane l: row l % 16, k
// 8 (l / 16)), two n-tiles of B in another (lane l: n (l % 8) + 8 (l / 16), k 8 ((l / 8) % 2)),
// split into tf32 operands (exact). The same products, operands and order as gemm's.
template <int NT, int KD, int AI, int BN, typename T>
__device__ __forceinline__ void gemm_rows16(float (&acc)[1][NT][4], const T* A, const T* B,
                                            int lane) {
  static_assert(NT % 2 == 0 && KD % 16 == 0 && !is_f32<T>, "16-bit operands, n-tiles in pairs");
  const T* pa = A + (lane & 15) * AI + 8 * (lane >> 4);
  const T* pb = B + ((lane & 7) + 8 * (lane >> 4)) * BN + 8 * ((lane >> 3) & 1);
#pragma unroll
  for (int k0 = 0; k0 < KD; k0 += 16) {
    uint32_t ra[4], rb[NT / 2][4];
    ldsm4<false>(ra, pa + k0);
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) ldsm4<false>(rb[np], pb + np * 16 * BN + k0);
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // k-steps k0 and k0 + 8
      uint32_t a[4];
      a_frag16<T>(ra, h, a);
#pragma unroll
      for (int n = 0; n < NT; ++n) {  // n-tile n: register 2 (n % 2) + h of its pair's load
        uint32_t b0, b1;
        split16<T>(rb[n / 2][2 * (n % 2) + h], b0, b1);
        mma8(acc[0][n], a, b0, b1);
      }
    }
  }
}

// ROWS x COLS elements (16 bytes a multiple of a row) from global rows of stride sst into shared
// rows of stride LD (elements; 16-byte aligned rows), 16 bytes per cp.async, by NT threads; rows
// >= L are zero-filled (FULL: every row is < L). Thread tid takes the piece tid % C4 of rows
// tid / C4, + NT / C4, ...: one source and one shared address a thread, stepped by constants, so
// that a piece costs its copy, a compare and a 64-bit add.
template <int ROWS, int COLS, int LD, int NT = kThreads, bool FULL = false, typename T>
__device__ __forceinline__ void load_tile(T* dst, const T* src, long sst, int L, int tid) {
  constexpr int E = 16 / sizeof(T), C4 = COLS / E, RS = NT / C4;
  static_assert(COLS % E == 0 && (LD * sizeof(T)) % 16 == 0, "16-byte pieces");
  static_assert(NT % C4 == 0, "whole rows a step");
  const int r0 = (unsigned)tid / C4, c = ((unsigned)tid % C4) * E;
  T* d = dst + r0 * LD + c;
#ifndef WB_MMA_EMU
  const unsigned ds = (unsigned)__cvta_generic_to_shared(d);
#endif
  const T* s = src + r0 * sst + c;
  const long step = RS * sst;
#pragma unroll
  for (int it = 0; it < (ROWS + RS - 1) / RS; ++it) {
    const int r = r0 + it * RS;
    if (ROWS % RS == 0 || r < ROWS) {
      if (FULL || r < L)
#ifdef WB_MMA_EMU
        wbemu::cp_async(d + it * RS * LD, s, 16);
#else
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(
                         ds + (unsigned)(it * RS * LD * sizeof(T))), "l"(s));
#endif
      else
        *reinterpret_cast<float4*>(d + it * RS * LD) = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    s += step;
  }
}

// one 16-byte cp.async (global to shared; shared address sa of the generic pointer d)
__device__ __forceinline__ void cp16(void* d, uint32_t sa, const void* src) {
#ifdef WB_MMA_EMU
  (void)sa;
  wbemu::cp_async(d, src, 16);
#else
  (void)d;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sa), "l"(src));
#endif
}

// The lower block triangle of NM stacked C x C float matrices from the workspace (row stride C)
// into shared rows of stride kPS: the 16 x 16 blocks (rt, ct) with ct <= rt, 10 of a matrix's 16,
// by NT threads, 16 bytes a cp.async. The passes' products by Tinv and PT read no other element
// (the shared-memory pass: row tile rt over depth 16 (rt + 1); the register passes: 8 x 8 blocks on
// or below the diagonal), so the other six blocks are not copied (37.5% of those bytes).
// Thread id copies piece id % 4 of rows id / 4 (+ NT / 4 ..) of each column block ct's rows
// 16 ct .. C - 1: one source and one shared address a thread, every copy at a constant offset
// from them (a row test only where NT / 4 does not divide 16).
template <int NM, int NT>
__device__ __forceinline__ void load_tri(float* dst, const float* src, int id) {
  constexpr int RS = NT / 4;  // rows a step
  static_assert(NT % 32 == 0, "whole warps");
  const int r0 = id / 4, c = 4 * (id % 4);
  float* d = dst + r0 * kPS + c;
  const float* s = src + r0 * kC + c;
  const uint32_t ds = wbmma::smem_u32(d);
#pragma unroll
  for (int m = 0; m < NM; ++m)
#pragma unroll
    for (int ct = 0; ct < 4; ++ct)
#pragma unroll
      for (int st = 0; st < (kC - 16 * ct + RS - 1) / RS; ++st) {
        const int r = 16 * ct + st * RS;  // this step's first row
        if (16 % RS == 0 || r0 + r < kC) {
          const int od = (m * kC + r) * kPS + 16 * ct, os = (m * kC + r) * kC + 16 * ct;
          cp16(d + od, ds + (unsigned)(od * 4), s + os);
        }
      }
}

// -------------------------------------------------------------------------- packed batches

// A packed (varlen) batch's sequences for one launch, passed by value: sequence i is tokens
// tok[i] .. tok[i + 1] of a batch of one (absolute along T) and chunks chk[i] .. chk[i + 1] of the
// launch's workspace (each sequence chunked from its own first token: no chunk crosses a
// boundary). n = 0: not packed, a batch of B sequences of T tokens. Larger packed batches take
// one launch per kSeqs sequences.
constexpr int kSeqs = 128;
struct Packed {
  int n;                // sequences of this launch (0: a plain batch)
  int nc;               // their chunks, all together
  int tok[kSeqs + 1];   // token offsets
  int chk[kSeqs + 1];   // chunk offsets, from 0
  int order;            // the pass's blocks in the order of ord (1) or as launched (0)
  int ord[kSeqs];       // the sequences by decreasing chunks (ties: in the batch's order)
};

// Where a block's sequence lies: b the batch index of the token tensors (q, k, v, g, beta, o, the
// workspace rows), first its first token, len its tokens, sb its state's index, nc its chunks and
// crow the workspace row (in chunks) of its first chunk.
struct SeqAt {
  int b, first, len, sb, nc;
  long crow;
};

// The pass's block of a grid (sequences * HV, column groups): x = sequence * HV + hv and y the
// column group, as launched; or, in a packed launch with pk.order, the block's linear index taken
// in the order of pk.ord (the launch's sequences by decreasing chunks), each sequence's heads and
// column groups together: the hardware starts blocks in about their linear order, so the blocks
// of the longest sequences, the pass's critical path, start first rather than behind shorter
// sequences' blocks. A sequence's arithmetic is the same either way.
struct PassBlock {
  int x, y;
};
__device__ __forceinline__ PassBlock pass_block(const Packed& pk, int HV) {
  const int bx = (int)blockIdx.x, by = (int)blockIdx.y;
  if (pk.n == 0 || !pk.order) return PassBlock{bx, by};
  const int G = (int)gridDim.y, l = by * (int)gridDim.x + bx, r = l / HV;
  return PassBlock{pk.ord[r / G] * HV + l % HV, r % G};
}

// The sequence of the pass's block x = sequence * HV + hv (both passes).
__device__ __forceinline__ SeqAt pass_seq(const Packed& pk, int x, int HV, int T, int NC) {
  const int i = x / HV, hv = x % HV;
  if (pk.n == 0) return SeqAt{i, 0, T, i, NC, (long)x * NC};
  return SeqAt{0, pk.tok[i], pk.tok[i + 1] - pk.tok[i], i, pk.chk[i + 1] - pk.chk[i],
               (long)hv * pk.nc + pk.chk[i]};
}

// The sequence holding chunk c of a packed launch (the last i with chk[i] <= c: empty sequences,
// which own no chunk, are passed over).
__device__ __forceinline__ int packed_seq_of_chunk(const Packed& pk, int c) {
  int lo = 0, hi = pk.n - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (pk.chk[mid] <= c) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// ---------------------------------------------------------------------------- q, k L2 norms

// Row (b, t, h) of the per-row arrays nq, nk [B, T, H].
__device__ __forceinline__ long qk_row(int b, int t, int h, int T, int H) {
  return ((long)b * T + t) * H + h;
}
// The per-row factor of a norm array, 1 where there is none (no L2 norm: products unchanged).
__device__ __forceinline__ float norm_at(const float* __restrict__ n, long row) {
  return n ? n[row] : 1.f;
}

// nq, nk = 1 / sqrt(sum x^2 + 1e-6) over each row of q and k (the models' in-kernel L2 norm,
// applied by the three kernels to the products they form from raw q and k), a warp per row,
// float32 sums in a fixed order.
template <typename QT>
__global__ void __launch_bounds__(kThreads)
mma_l2_norms(const QT* __restrict__ q, const QT* __restrict__ k, float* __restrict__ nq,
             float* __restrict__ nk, long rows, int K) {
  const long r = (long)blockIdx.x * (kThreads / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;
  float sq = 0.f, sk = 0.f;
  for (int c = lane; c < K; c += 32) {
    const float a = to_f(q[r * K + c]), b = to_f(k[r * K + c]);
    sq += a * a;
    sk += b * b;
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    sq += __shfl_xor_sync(0xffffffffu, sq, off);
    sk += __shfl_xor_sync(0xffffffffu, sk, off);
  }
  if (lane == 0) {
    nq[r] = 1.f / sqrtf(sq + 1e-6f);
    nk[r] = 1.f / sqrtf(sk + 1e-6f);
  }
}

// ------------------------------------------------------------------------------------ prepare

// Element pair (i, c), (i, c + 1) of a 64 x 64 workspace matrix at m (Tinv's or PT's region, kC x
// kC floats): float32 (row-major), or, for the wgmma pass (halves), as two bf16 matrices in the
// same bytes, hi = bf16(x) row-major then lo = bf16(x - hi): the operand tiles that pass copies
// as they are (tf32 values split exactly)
template <bool HALVES>
__device__ __forceinline__ void put_ws(float* m, int i, int c, float2 x) {
  if constexpr (!HALVES) {
    *reinterpret_cast<float2*>(m + i * kC + c) = x;
    return;
  }
  const __nv_bfloat162 hi = __floats2bfloat162_rn(x.x, x.y);
  const __nv_bfloat162 lo = __floats2bfloat162_rn(x.x - __bfloat162float(hi.x), x.y - __bfloat162float(hi.y));
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(m);
  h[(i * kC + c) / 2] = hi;
  h[(kC * kC + i * kC + c) / 2] = lo;
}

// One warp, 32 columns of R (row stride LDR; the tf32 right-hand sides, replaced in place by the
// solution): (I + A) Y = R by blocked forward substitution over the four 16-row blocks,
//   T = R_I - sum_{J<I} A_IJ Y_J (tf32 operands, float32 sums), Y_I = (I + A_II)^-1 T,
// with A's blocks below the diagonal blocks and the inverse diagonal blocks Xd (block I at rows
// 16 I.., columns 0-15, row stride kXS)
// already rounded to tf32. Y (rounded to tf32) goes to columns c0.. of the workspace matrix out
// (float32; OUT false: only to R), every row.
// The right-hand sides are columns c0.. of the identity (c0 a multiple of 32), formed here (R's
// rows are only written, each before it is read as Y). skip: the blocks above row block
// I0 = c0 / 16 are zero and Y_I0 is [X_I0 | 0] (its T is the identity's [I | 0]: the product
// with it gives X_I0's own tf32 values, the zero columns +0), so they are written as such rather
// than formed by a product each: the same bits, one stage of four fewer on warp 0's chain (the
// longest); WORKBENCH_GDN_MMA_SOLVE=full forms every block (A/Bs).
template <int LDR, bool OUT>
__device__ __forceinline__ void solve_block_columns(const float* As, const float* Xd, float* R,
                                                    float* out, int lane, int c0, bool skip) {
  const int gq = lane >> 2, tq = lane & 3;
  const int I0 = skip ? c0 / 16 : -1;
#pragma unroll
  for (int I = 0; I < 4; ++I) {
    if (I <= I0) {  // zero above I0; [X_I0 | 0] at I0
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int i = 16 * I + gq + 8 * hf, c = nt * 8 + 2 * tq;
          const float2 yr = I == I0 && nt < 2
                                ? *reinterpret_cast<const float2*>(Xd + i * kXS + c)
                                : make_float2(0.f, 0.f);
          *reinterpret_cast<float2*>(R + i * LDR + c) = yr;
          if constexpr (OUT) put_ws<false>(out, i, c0 + c, yr);
        }
      __syncwarp();
      continue;
    }
    float acc[1][4][4];
    zero(acc);
    if (I > 0) gemm_to<1, 4, kPS, 1, LDR, 1>(acc, As + 16 * I * kPS, R, 16 * I, lane);
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int i = 16 * I + gq + 8 * hf, c = c0 + nt * 8 + 2 * tq;
        float2* p = reinterpret_cast<float2*>(R + i * LDR + nt * 8 + 2 * tq);
        const float2 r = make_float2(i == c ? 1.f : 0.f, i == c + 1 ? 1.f : 0.f);
        *p = make_float2(rtf32(r.x - acc[0][nt][2 * hf]), rtf32(r.y - acc[0][nt][2 * hf + 1]));
      }
    __syncwarp();
    float y[1][4][4];
    zero(y);
    gemm<1, 4, 16, kXS, 1, LDR, 1>(y, Xd + 16 * I * kXS, R + 16 * I * LDR, lane);
    __syncwarp();  // every lane has read T before it is overwritten
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int i = 16 * I + gq + 8 * hf, c = nt * 8 + 2 * tq;
        const float2 yr = make_float2(rtf32(y[0][nt][2 * hf]), rtf32(y[0][nt][2 * hf + 1]));
        *reinterpret_cast<float2*>(R + i * LDR + c) = yr;
        if constexpr (OUT) put_ws<false>(out, i, c0 + c, yr);
      }
    __syncwarp();  // Y_I is visible to the warp before the next block reads it
  }
}

constexpr int kTS = kC + 4;  // row stride of the right-hand sides (4 mod 16: B operands)

// How prepare forms (I + A)^-1 (WORKBENCH_GDN_MMA_SOLVE): the substitution forming every block
// (full), the substitution with its first blocks written (the default), blocked doubling.
enum Solve { kSolveFull = 0, kSolveShort = 1, kSolveDoubling = 2 };

// (I + A)^-1 into T (row stride kTS) by blocked doubling instead of substitution
// (WORKBENCH_GDN_MMA_SOLVE=doubling, for the A/B; unmeasured), warps 0-1 (w), each from the
// inverse diagonal blocks it formed itself (Xd, tf32), then from the other's after they meet:
//   level 2, warp w: T_{2w+1,2w} = -X_{2w+1} (A_{2w+1,2w} X_{2w})       (16 x 16, depth 16 twice)
//   level 3, warp w on columns 16w..16w+15 of the lower left 32 x 32 quadrant:
//     N = A_[23][01] T_[01][01],  T_[23][01] = -T_[23][23] N           (depth 32, then 16 / 32)
// Each product's operands tf32, sums float32, every result rounded to tf32 (-rtf32(x) =
// rtf32(-x): the rounding is symmetric), the same rounding points as the substitution at level 2
// (so T_10 and T_32 are its bits) and other sums at level 3. A warp's chain is four products of
// 8-28 mma (the substitution's warp 0: six of 72 mma in all). Warp w writes its 32 rows' diagonal
// blocks and zero blocks; every element of T goes to out as well (OUT).
template <bool OUT>
__device__ __forceinline__ void solve_doubling(const float* As, const float* Xd, float* T,
                                               float* out, int w, int lane) {
  const int gq = lane >> 2, tq = lane & 3;
  auto wr = [&](int i, int c, float2 x) {
    *reinterpret_cast<float2*>(T + i * kTS + c) = x;
    if constexpr (OUT) put_ws<false>(out, i, c, x);
  };
  // the warp's rows 32w..: X on the diagonal blocks, zeros above them (and in block (2, 3)); the
  // blocks below are formed by the products (rows 32-63, columns 0-31: both warps at level 3)
  for (int idx = lane; idx < 32 * 32; idx += 32) {
    const int i = 32 * w + idx / 32, c = 2 * (idx % 32), I = i / 16, J = c / 16;
    if (J < I && (w == 1 || J == 0)) continue;  // formed below: (1, 0); (2|3, 0|1), (3, 2)
    wr(i, c, J == I ? *reinterpret_cast<const float2*>(Xd + i * kXS + c - 16 * J)
                     : make_float2(0.f, 0.f));
  }
  // level 2: M = -rtf32(A_{2w+1,2w} X_{2w}) into T's block (2w+1, 2w), then X_{2w+1} M over it
  const int r0 = 16 * (2 * w + 1), c0 = 32 * w;
  float m[1][2][4];
  zero(m);
  gemm<1, 2, 16, kPS, 1, kXS, 1>(m, As + r0 * kPS + c0, Xd + c0 * kXS, lane);
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf)
      *reinterpret_cast<float2*>(T + (r0 + gq + 8 * hf) * kTS + c0 + 8 * nt + 2 * tq) =
          make_float2(-rtf32(m[0][nt][2 * hf]), -rtf32(m[0][nt][2 * hf + 1]));
  __syncwarp();
  zero(m);
  gemm<1, 2, 16, kXS, 1, kTS, 1>(m, Xd + r0 * kXS, T + r0 * kTS + c0, lane);
  __syncwarp();  // every lane has read M before it is overwritten
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf)
      wr(r0 + gq + 8 * hf, c0 + 8 * nt + 2 * tq,
          make_float2(rtf32(m[0][nt][2 * hf]), rtf32(m[0][nt][2 * hf + 1])));
  // level 3 reads T_[01][01] (warp 0's) and T_[23][23] (warp 1's)
  named_sync<1, 64>();
  const int cw = 16 * w;
  float n[2][2][4];
  zero(n);
  // N = A_[23][01] T_[01][01] at columns cw..: T's rows above cw are zero there
  if (w == 0)
    gemm<2, 2, 32, kPS, 1, kTS, 1>(n, As + 32 * kPS, T + cw, lane);
  else
    gemm<2, 2, 16, kPS, 1, kTS, 1>(n, As + 32 * kPS + 16, T + 16 * kTS + cw, lane);
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf)
        *reinterpret_cast<float2*>(T + (32 + 16 * mt + gq + 8 * hf) * kTS + cw + 8 * nt + 2 * tq) =
            make_float2(-rtf32(n[mt][nt][2 * hf]), -rtf32(n[mt][nt][2 * hf + 1]));
  __syncwarp();
  // T_[23][01] = T_[23][23] (-N): rows 32-47 X_2 N_2 (depth 16), rows 48-63 T_32 N_2 + X_3 N_3
  float y2[1][2][4], y3[1][2][4];
  zero(y2);
  zero(y3);
  gemm<1, 2, 16, kTS, 1, kTS, 1>(y2, T + 32 * kTS + 32, T + 32 * kTS + cw, lane);
  gemm<1, 2, 32, kTS, 1, kTS, 1>(y3, T + 48 * kTS + 32, T + 32 * kTS + cw, lane);
  __syncwarp();  // every lane has read N before it is overwritten
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int c = cw + 8 * nt + 2 * tq;
      wr(32 + gq + 8 * hf, c, make_float2(rtf32(y2[0][nt][2 * hf]), rtf32(y2[0][nt][2 * hf + 1])));
      wr(48 + gq + 8 * hf, c, make_float2(rtf32(y3[0][nt][2 * hf]), rtf32(y3[0][nt][2 * hf + 1])));
    }
}

// Prepare's shared memory (floats). The keys and queries are dead once the raw products K K^T and
// Q K^T are in registers (before the first value head), so P and the diagonal inverse blocks
// (16 columns, kXS a row) reuse their bytes: 60 KiB at K = 64 and 70 KiB at K = 128 with 16-bit
// inputs (90 and 106 KiB before 2026-12-07; 4 KiB more with the gates prefetched). Two blocks an
// SM all the same (registers: 128 a thread); three (80 registers, spilling about 30 values) were
// 5-7% slower on the H200.
// WORKBENCH_GDN_MMA_GATES=prefetch (for the A/B; unmeasured): prepare loads the gates and beta of
// all its value heads (at most kGatePre) with the keys and queries, before the raw products,
// instead of each value head's at its own start, where their latency is the gate scan's; the same
// values
constexpr int kGatePre = 8;

template <int K, typename QT>
struct PrepSmem {
  static constexpr int SK = K + 8;  // key and query rows (QT elements)
  static constexpr int QK = kC * SK * (int)sizeof(QT) / 4;
  static constexpr int PX = kC * kPS + kC * kXS;  // P, then the diagonal inverse blocks
  static constexpr int Ks = 0, Qs = Ks + QK, Ps = 0, Xs = Ps + kC * kPS,
                       As = 2 * QK > PX ? 2 * QK : PX, Ts = As + kC * kPS, gc = Ts + kC * kTS,
                       bt = gc + kC, nq = bt + kC, nk = nq + kC, gb = nk + kC,
                       floats = gb + 2 * kC * kGatePre;
};

// Per (b, h, chunk), all chunks in parallel, for each of the HV / H value heads hv of key head h
// in turn: the cumulative decays gc, Tinv = (I + A)^-1 and PT = P Tinv (to tinv: kChunkWs floats
// per chunk and value head, Tinv then PT, [64][64] each, rounded to tf32; both lower triangular,
// Tinv with a unit diagonal and identity rows past the chunk's end; then the passes' per-position
// factors from gc, beta and the L2-norm factors, kFac), with P = (Q K^T) * exp(gc_i - gc_j)
// (lower, with the diagonal; rounded to tf32). The raw products K K^T and Q K^T by mma from the
// keys and queries as given (rounded at the fragment loads), once for the key head and kept in
// registers (they do not depend on hv: the value heads of a key head share them bit for bit);
// then for each hv: A = K K^T decayed, scaled by beta and the L2-norm factors; the 16 x 16
// diagonal blocks of (I + A)^-1 in float32 (warps 0-1, gdn_mma.h); the identity's columns by
// blocked forward substitution (warps 0-1, 32 columns each; or by blocked doubling,
// solve_doubling, forced only) while warps 2-7 form P from their
// Q K^T; then PT by mma (every warp, one 16 x 32 tile).
template <int K, typename QT, bool HALVES = false>
__global__ void __launch_bounds__(kThreads, 2)
mma_prepare(const QT* __restrict__ q, const QT* __restrict__ k, const float* __restrict__ g,
            const float* __restrict__ beta, const float* __restrict__ nq,
            const float* __restrict__ nk, float* __restrict__ tinv, int T, int H, int HV, int NC,
            int hvs, int solve, bool pre_gates, const Packed pk) {
  using S = PrepSmem<K, QT>;
  constexpr int SK = S::SK;
  WB_CLK_INIT(0);
  WB_DYNAMIC_SMEM(float4, smem4);
  float* sm = reinterpret_cast<float*>(smem4);
  QT* Ks = reinterpret_cast<QT*>(sm + S::Ks);  // [C][SK] keys as given
  QT* Qs = reinterpret_cast<QT*>(sm + S::Qs);  // [C][SK] queries as given
  float* As = sm + S::As;  // [C][PS]  A (strictly lower), float32; below the diagonal blocks tf32
  float* Xs = sm + S::Xs;  // [C][XS]  the diagonal blocks of (I + A)^-1 (block I at rows 16 I..), tf32
  float* Ts = sm + S::Ts;  // [C][TS]  (I + A)^-1 (tf32), written by the substitution
  float* Ps = sm + S::Ps;  // [C][PS]  tf32(P) (over the keys and queries, dead by then)
  float* gc = sm + S::gc;  // [C] cumulative log decay
  float* bt = sm + S::bt;  // [C] beta
  float* nqv = sm + S::nq;  // [C] the L2-norm factors of the queries (1: none)
  float* nkv = sm + S::nk;  // [C] and of the keys
  float* gbs = sm + S::gb;  // [2][kGatePre][C] the gates, then beta, of the value heads (prefetch)
  // hvs value heads a block (HV / H: all of a key head's; 1: one, as before 2026-12-06, for the
  // A/B), the group x of HV / hvs: block x = (b HV / hvs + x) NC + chunk, or packed
  // x pk.nc + chunk (NC = pk.nc); the workspace row of value head hv: (b HV + hv) NC + chunk, or
  // packed hv pk.nc + chunk
  const int groups = HV / hvs;
  int b, hv0, t0, L, row0, hstride;
  if (pk.n == 0) {
    const int bx = blockIdx.x / NC, n = blockIdx.x % NC;
    b = bx / groups, hv0 = (bx % groups) * hvs, t0 = n * kC, L = gdn::imin(kC, T - t0);
    row0 = b * HV * NC + n, hstride = NC;
  } else {
    const int c = blockIdx.x % pk.nc, i = packed_seq_of_chunk(pk, c);
    b = 0, hv0 = (blockIdx.x / pk.nc) * hvs, t0 = pk.tok[i] + (c - pk.chk[i]) * kC;
    L = gdn::imin(kC, pk.tok[i + 1] - t0);
    row0 = c, hstride = pk.nc;
  }
  const int h = hv0 / (HV / H);
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, gq = lane >> 2, tq = lane & 3;
  load_tile<kC, K, SK>(Ks, k + gdn::qk_index(b, t0, h, T, H, K), (long)H * K, L, tid);
  load_tile<kC, K, SK>(Qs, q + gdn::qk_index(b, t0, h, T, H, K), (long)H * K, L, tid);
  cp_commit();
  const bool pre = pre_gates && hvs <= kGatePre;  // (gbs allocated only where pre_gates)
  if (pre) {  // every value head's gates and beta (0 past the chunk's end), loads first
    constexpr int kPer = 2 * kC * kGatePre / kThreads;
    const int n = hvs * kC;
    float v[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int idx = tid + j * kThreads, m = idx / n % 2, t = idx % n / hvs, x = idx % hvs;
      v[j] = idx < 2 * n && t < L ? (m ? beta : g)[gdn::gate_index(b, t0 + t, hv0 + x, T, HV)] : 0.f;
    }
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int idx = tid + j * kThreads, m = idx / n % 2, t = idx % n / hvs, x = idx % hvs;
      if (idx < 2 * n) gbs[(m * kGatePre + x) * kC + t] = v[j];
    }
  }
  if (w == 1) {  // the L2-norm factors of the chunk's queries and keys
    for (int i = lane; i < kC; i += 32) {
      nqv[i] = i < L ? norm_at(nq, qk_row(b, t0 + i, h, T, H)) : 1.f;
      nkv[i] = i < L ? norm_at(nk, qk_row(b, t0 + i, h, T, H)) : 1.f;
    }
  }
  cp_wait<0>();
  __syncthreads();
  launch_dependents();  // the pass may start (a dependent launch; its copies wait for this grid's end)
  WB_CLK(0);
  // the raw products, kept for every value head: K K^T at rows ia.., columns na.. (zero tiles
  // above the diagonal blocks are not formed), Q K^T (warps 2-7) at rows ip.., columns jp..
  const int ia = (w & 3) * 16, na = (w >> 2) * 32;
  const int ip = w < 6 ? 16 * (w - 2) : 16 * (w - 4), jp = w < 6 ? 0 : 32;
  float ka[1][4][4], pa[1][4][4];
  zero(ka);
  zero(pa);
  if (na <= ia + 15) {
    if constexpr (is_f32<QT>)
      gemm<1, 4, K, SK, 1, 1, SK, true, true>(ka, Ks + ia * SK, Ks + na * SK, lane);
    else
      gemm_rows16<4, K, SK, SK>(ka, Ks + ia * SK, Ks + na * SK, lane);
  }
  if (w >= 2) {
    if constexpr (is_f32<QT>)
      gemm<1, 4, K, SK, 1, 1, SK, true, true>(pa, Qs + ip * SK, Ks + jp * SK, lane);
    else
      gemm_rows16<4, K, SK, SK>(pa, Qs + ip * SK, Ks + jp * SK, lane);
  }
  WB_CLK(1);
  for (int vh = 0; vh < hvs; ++vh) {
    const int hv = hv0 + vh;
    float* out = tinv + (long)(row0 + (long)hv * hstride) * kChunkWs;  // Tinv, PT, the factors
    if (w == 0) {  // inclusive scan of g over the chunk, two steps per lane
      const int i0 = 2 * lane, i1 = i0 + 1;
      // position i's gate (m = 0) or beta (m = 1): prefetched, or loaded (0 past the chunk's end)
      auto gate = [&](int m, int i) {
        return pre ? gbs[(m * kGatePre + vh) * kC + i]
                   : i < L ? (m ? beta : g)[gdn::gate_index(b, t0 + i, hv, T, HV)] : 0.f;
      };
      const float a0 = gate(0, i0), a1 = gate(0, i1);
      float s = a0 + a1;
#pragma unroll
      for (int off = 1; off < 32; off <<= 1) {
        const float y = __shfl_up_sync(0xffffffffu, s, off);
        if (lane >= off) s += y;
      }
      float ex = __shfl_up_sync(0xffffffffu, s, 1);
      if (lane == 0) ex = 0.f;
      const float c0 = ex + a0, c1 = c0 + a1;
      gc[i0] = c0;
      gc[i1] = c1;
      bt[i0] = gate(1, i0);
      bt[i1] = gate(1, i1);
    }
    WB_CLK(2);
    __syncthreads();
    WB_CLK(3);
    // A = K K^T, decayed and scaled, strictly lower
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int i = ia + gq + 8 * (r >> 1), j = na + nt * 8 + 2 * tq + (r & 1);
        const float a = j < i ? bt[i] * (ka[0][nt][r] * (nkv[i] * nkv[j])) * expf(gc[i] - gc[j])
                              : 0.f;
        As[i * kPS + j] = j / 16 < i / 16 ? rtf32(a) : a;  // below the diagonal blocks: operands
      }
    WB_CLK(4);
    __syncthreads();
    WB_CLK(5);
    if (tid < 64) {  // warps 0-1: the diagonal blocks of (I + A)^-1, one column each
      const int o = (tid / 16) * 16, j = tid % 16;
      float x[16];
      gdn::inverse_diag16_column(As, kPS, o, j, x);
#pragma unroll
      for (int i = 0; i < 16; ++i) Xs[(o + i) * kXS + j] = rtf32(x[i]);
      // (I + A)^-1, 32 columns per warp: warp 0 formed diagonal blocks 0-1 and warp 1 blocks
      // 2-3, and each warp's substitution reads all four, so the two warps meet first (named
      // barrier)
      if (solve == kSolveDoubling) {  // each warp starts from its own blocks
        __syncwarp();
        solve_doubling<!HALVES>(As, Xs, Ts, out, w, lane);
      } else {
        named_sync<1, 64>();
        solve_block_columns<kTS, !HALVES>(As, Xs, Ts + 32 * w, out, lane, 32 * w,
                                          solve == kSolveShort);
      }
    } else {  // warps 2-7: P, one 16 x 32 tile each of the six on or below the diagonal
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int i = ip + gq + 8 * (r >> 1), j = jp + nt * 8 + 2 * tq + (r & 1);
          Ps[i * kPS + j] =
              j <= i ? rtf32(pa[0][nt][r] * (nqv[i] * nkv[j]) * expf(gc[i] - gc[j])) : 0.f;
        }
    }
    WB_CLK(6);
    __syncthreads();
    WB_CLK(7);
    {  // PT = P Tinv, rows 16 (w % 4).., columns 32 (w / 4).. (upper tiles: zeros, not computed)
      const int i0 = (w & 3) * 16, j0 = (w >> 2) * 32;
      float acc[1][4][4];
      zero(acc);
      if (j0 <= i0 + 15)
        gemm_to<1, 4, kPS, 1, kTS, 1>(acc, Ps + i0 * kPS, Ts + j0, i0 + 16, lane);
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int i = i0 + gq + 8 * hf, c = j0 + nt * 8 + 2 * tq;
          // (halves: PT to As, free since the substitution, then both halves below)
          *reinterpret_cast<float2*>(HALVES ? As + i * kPS + c : out + kC * kC + i * kC + c) =
              make_float2(rtf32(acc[0][nt][2 * hf]), rtf32(acc[0][nt][2 * hf + 1]));
        }
    }
    if constexpr (HALVES) {  // Tinv's and PT's halves from shared memory (Tinv: the substitution's R)
      __syncthreads();
      for (int idx = tid; idx < kC * kC; idx += kThreads) {
        const int m = idx / (kC * kC / 2), r = (idx / (kC / 2)) % kC, c = 2 * (idx % (kC / 2));
        put_ws<true>(out + m * kC * kC, r, c, *reinterpret_cast<const float2*>(m ? As + r * kPS + c : Ts + r * kTS + c));
      }
    }
    WB_CLK(8);
    {  // the passes' per-position factors (kFac): the expressions the passes evaluated themselves
       // until 2026-12-05, on the values they staged then (past the chunk's end gc 0, beta 0 and
       // norm factors 1), so the bits are theirs (benchmarks/gdn_emu_bitwise.py)
      const float gl = gc[L - 1];
      for (int idx = tid; idx < kFacRows * kC; idx += kThreads) {
        const int part = idx / kC, i = idx % kC;
        const float gi = i < L ? gc[i] : 0.f;
        float f;
        if (part == 0) f = expf(gi) * nkv[i];
        else if (part == 1) f = expf(gi) * nqv[i];
        else if (part == 2) f = bt[i];
        else if (part == 3) f = i < L ? expf(gl - gc[i]) * nkv[i] : 0.f;
        else f = i == 0 ? expf(gl) : 0.f;
        out[kFac + idx] = f;
      }
    }
    WB_CLK(9);
    __syncthreads();  // the next value head overwrites gc, beta, A, Tinv and P
    WB_CLK(10);
    WB_CLK_COUNT();
  }
}

// ------------------------------------------------------------------------------- the pass

// Value columns a block of the shared-memory pass: 32 (its launch by default) or 16 (twice the
// blocks, each chunk's products over the 8 warps in half the steps a warp; `smem16`).
template <int BV>
constexpr bool pass_bv_ok = BV == 32 || BV == 16;

// One stage of the pass (two, alternating): a chunk's keys (QT, as given), Tinv and PT (tf32,
// from prepare; their lower block triangles, load_tri), the block's BV value columns (QT) and the
// chunk's factor rows (kFac). Offsets in floats. float32 inputs take narrower strides (bank
// conflicts on some loads) so that two stages fit in shared memory.
template <int K, typename QT, int BV>
struct PassStage {
  static constexpr int SKK = is_f32<QT> ? K + 4 : K + 8, SVT = is_f32<QT> ? BV + 4 : BV + 8;
  static constexpr int Kk = 0, Tv = Kk + kC * SKK * (int)sizeof(QT) / 4, PTv = Tv + kC * kPS,
                       Vt = PTv + kC * kPS, F = Vt + kC * SVT * (int)sizeof(QT) / 4,
                       floats = F + kFacRows * kC;
  static_assert(Tv % 4 == 0 && Vt % 4 == 0 && F % 4 == 0, "16-byte stage rows");
};

// The 16-column blocks with 16-bit inputs stage leanly: only the keys and the factor rows have two
// buffers; Tinv / PT and the value columns have one, refilled once the chunk is done with them (V
// after R, Tinv and PT after U and o), so that two blocks fit on an SM (110.5 KiB of shared memory
// at K = 128, at most 128 registers a thread: 16 warps an SM).
template <int K, typename QT, int BV>
constexpr bool pass_lean = BV == 16 && !is_f32<QT>;

// The chunk's inputs (two stages; lean: [keys 0][keys 1][factors 0][factors 1][Tinv][PT][V]),
// then the chunk's queries (one buffer: the next chunk's are copied once this one's are used),
// the rounded state and the block's intermediates. Offsets in floats; keys(n) .. vals(n): where
// chunk n's inputs lie. SR: the row stride of the C x BV tiles R and U (4 mod 16: B operands).
template <int K, typename QT, int BV>
struct PassSmem {
  using P = PassStage<K, QT, BV>;
  static constexpr bool lean = pass_lean<K, QT, BV>;
  static constexpr int SQ = is_f32<QT> ? K + 4 : K + 8, SST = is_f32<QT> ? K + 4 : K + 8,
                       SUT = kC + 8, SR = BV + 4;
  static constexpr int KS = kC * P::SKK * (int)sizeof(QT) / 4, FS = kFacRows * kC,
                       LF = 2 * KS, LT = LF + 2 * FS, LV = LT + 2 * kC * kPS,
                       inputs = lean ? LV + kC * P::SVT * (int)sizeof(QT) / 4 : 2 * P::floats;
  static constexpr int Qs = inputs, Ss = Qs + kC * SQ * (int)sizeof(QT) / 4,
                       Ud = Ss + BV * SST, Rs = Ud + BV * SUT, floats = Rs + kC * SR;
  static_assert(KS % 4 == 0 && LT % 4 == 0 && LV % 4 == 0 && Qs % 4 == 0, "16-byte rows");
  __host__ __device__ static constexpr int keys(int n) {
    return lean ? (n & 1) * KS : (n & 1) * P::floats + P::Kk;
  }
  __host__ __device__ static constexpr int facs(int n) {
    return lean ? LF + (n & 1) * FS : (n & 1) * P::floats + P::F;
  }
  __host__ __device__ static constexpr int tinv(int n) {
    return lean ? LT : (n & 1) * P::floats + P::Tv;
  }
  __host__ __device__ static constexpr int vals(int n) {
    return lean ? LV : (n & 1) * P::floats + P::Vt;
  }
};

// The chunk recurrence after prepare, one block of 8 warps per (b, hv, BV value columns),
// sequential over chunks, the state tile in mma accumulators. Per chunk, from the state S before
// it (rounded to tf32, in shared memory):
//   R = beta (V - exp(gc) K S)            (the delta rule's residuals; rounded to tf32)
//   U = Tinv R                            (= the W/U form's U - W S)
//   o = scale (exp(gc) Q S + PT R)        (PT R = P U)
//   S <- exp(gc_last) S + K^T (exp(gc_last - gc_j) U_j)
// with the L2-norm factors of q and k folded into the products (exp(gc) nk K S, nq Q S, the keys
// of the update; P has them from prepare). K S and Q S are each two chains over K / 2 (summed
// first half + second half), Tinv R and PT R one chain over the triangle's depth.
// BV = 32: warp w owns rows 16 (w % 4).. and columns 16 (w / 4).. of R, U and o and forms both
// K S and Q S there (sharing S's fragments), both Tinv R and PT R (sharing R's).
// BV = 16: warps 0-3 own rows 16 w.. of R and U (K S, then Tinv R) and warps 4-7 rows
// 16 (w - 4).. of o (Q S, then PT R), all 16 columns: each warp half the products of the
// 32-column block's, every element's products, operands and order the same (a column's results
// are bit for bit those of the 32-column pass).
// The state rows of the update, 8 warps over K x BV: K = 128: rows 16 w.., all BV columns;
// K = 64: rows 16 (w % 4).., columns (BV / 2) (w / 4)... Three block barriers a chunk; the next
// chunk's inputs are copied (cp.async) while this one computes (lean staging: its keys and
// factors from the first barrier on, V from the second, Tinv and PT from the third, the latter
// waited for at the next chunk's second barrier; two blocks an SM).
template <int K, typename QT, int BV>
__global__ void __launch_bounds__(kThreads + 64, pass_lean<K, QT, BV> ? 2 : 1)
mma_pass(const QT* __restrict__ q, const QT* __restrict__ k, const QT* __restrict__ v,
         const float* __restrict__ tinv, const float* h0, float* state, void* __restrict__ o,
         int T, int H, int HV, int V, float scale, int odt, int NC, const Packed pk) {
  static_assert(pass_bv_ok<BV>, "32 or 16 value columns a block");
  using P = PassStage<K, QT, BV>;
  using M = PassSmem<K, QT, BV>;
  constexpr bool kHalf = BV == 16;  // K S / Tinv R and Q S / PT R on separate warps
  constexpr int SKK = P::SKK, SQ = M::SQ, SST = M::SST, SUT = M::SUT, SR = M::SR;
  constexpr int NT3 = (K == 128 ? BV : BV / 2) / 8;  // the update's n-tiles a warp
  static_assert(SQ == SKK, "keys and queries share the fragments' row stride");
  WB_DYNAMIC_SMEM(float4, smem4);
  float* sm = reinterpret_cast<float*>(smem4);
  float* Ss = sm + M::Ss;  // [BV][SST]  tf32(state tile), transposed: the B operand of K S, Q S
  float* Ud = sm + M::Ud;  // [BV][SUT]  tf32(exp(gc_last - gc_j) nk_j U_j), transposed
  float* Rs = sm + M::Rs;  // [C][SR]    tf32(R)
  QT* Qs = reinterpret_cast<QT*>(sm + M::Qs);  // [C][SQ]  the chunk's queries as given
  const PassBlock pb = pass_block(pk, HV);
  const SeqAt sq = pass_seq(pk, pb.x, HV, T, NC);
  const int b = sq.b, hv = pb.x % HV, h = hv / (HV / H), c0 = pb.y * BV;
  const int tend = sq.first + sq.len;
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, gq = lane >> 2, tq = lane & 3;
  const int r3 = K == 128 ? 16 * w : 16 * (w & 3), n3 = K == 128 ? 0 : (BV / 2) * (w >> 2);
  const int r1 = 16 * (w & 3), n1 = kHalf ? 0 : 16 * (w >> 2);
  const bool qrole = kHalf && w >= 4;  // BV = 16: this warp forms Q S and PT R (warp-uniform)
  WB_CLK_INIT(1);
  // the copies, by the NT threads of the 8 warps (id: tid) or by the producer warps (NT 32 or 64,
  // id: their own thread index); chunk n's keys and factors (and but for lean staging Tinv, PT
  // and V) ...
  auto issue = [&](int n, auto nt, int id, bool split) {
    constexpr int NT = decltype(nt)::value;
    const int t0 = sq.first + n * kC, L = gdn::imin(kC, tend - t0);
    load_tile<kC, K, SKK, NT>(reinterpret_cast<QT*>(sm + M::keys(n)),
                              k + gdn::qk_index(b, t0, h, T, H, K), (long)H * K, L, id);
    const float* ws = tinv + (sq.crow + n) * kChunkWs;
    if constexpr (!M::lean) {  // Tinv and PT (split: Tinv; PT with the queries)
      if (split) load_tri<1, NT>(sm + M::tinv(n), ws, id);  // (their lower block triangles)
      else load_tri<2, NT>(sm + M::tinv(n), ws, id);
    }
    load_tile<kFacRows, kC, kC, NT, true>(sm + M::facs(n), ws + kFac, kC, kFacRows, id);
    if constexpr (!M::lean)
      load_tile<kC, BV, P::SVT, NT>(reinterpret_cast<QT*>(sm + M::vals(n)),
                                    v + gdn::v_index(b, t0, hv, T, HV, V) + c0, (long)HV * V, L, id);
    cp_commit();
  };
  // ... its queries (and for lean staging V; split: PT) ...
  auto issue_q = [&](int n, auto nt, int id, bool split) {
    constexpr int NT = decltype(nt)::value;
    const int t0 = sq.first + n * kC, L = gdn::imin(kC, tend - t0);
    load_tile<kC, K, SQ, NT>(Qs, q + gdn::qk_index(b, t0, h, T, H, K), (long)H * K, L, id);
    if constexpr (M::lean)
      load_tile<kC, BV, P::SVT, NT>(reinterpret_cast<QT*>(sm + M::vals(n)),
                                    v + gdn::v_index(b, t0, hv, T, HV, V) + c0, (long)HV * V, L, id);
    else if (split)
      load_tri<1, NT>(sm + M::tinv(n) + kC * kPS, tinv + (sq.crow + n) * kChunkWs + kC * kC, id);
    cp_commit();
  };
  // ... and for lean staging Tinv and PT, a copy group each
  auto issue_t = [&](int n, auto nt, int id) {
    constexpr int NT = decltype(nt)::value;
    load_tri<2, NT>(sm + M::tinv(n), tinv + (sq.crow + n) * kChunkWs, id);
    cp_commit();
  };
  using All = std::integral_constant<int, kThreads>;
  // one or two more warps launched (WORKBENCH_GDN_MMA_COPY, default two): they issue every copy,
  // at the consumers' three barriers a chunk, and wait for them before the first; the 8 warps
  // only compute. The copies land where and before they did when the 8 warps issued them (in the
  // non-lean stages PT now with the queries: the next chunk's, waited for at its first barrier),
  // so the results are the same.
  const int producers = (int)(blockDim.x - kThreads) / 32;
  const bool prod = producers > 0;
  auto produce = [&](auto nt, int id) {
    if (sq.nc > 0) {
      issue(0, nt, id, true);
      issue_q(0, nt, id, true);
      if constexpr (M::lean) issue_t(0, nt, id);
    }
    for (int n = 0; n < sq.nc; ++n) {
      if constexpr (M::lean) cp_wait<1>();
      else cp_wait<0>();
      __syncthreads();  // 1
      if (n + 1 < sq.nc) issue(n + 1, nt, id, true);
      if constexpr (M::lean) {
        if (n + 1 < sq.nc) cp_wait<1>();
        else cp_wait<0>();
      }
      __syncthreads();  // 2
      if (n + 1 < sq.nc) issue_q(n + 1, nt, id, true);
      __syncthreads();  // 3
      if constexpr (M::lean)
        if (n + 1 < sq.nc) issue_t(n + 1, nt, id);
    }
  };
  if (w >= kThreads / 32) {
    wait_for_primary();  // prepare's workspace complete (a dependent launch; else nothing)
    if (producers == 1) produce(std::integral_constant<int, 32>{}, tid - kThreads);
    else produce(std::integral_constant<int, 64>{}, tid - kThreads);
    return;
  }
  const long at = gdn::state_index(sq.sb, hv, HV, K, V) + c0;
  float* st = state + at;
  float s[1][NT3][4];  // rows r3 + gq (+8), columns n3 + 8nt + 2tq (+1): from h0, or zeros
#pragma unroll
  for (int nt = 0; nt < NT3; ++nt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int r = r3 + gq + 8 * hf, c = n3 + nt * 8 + 2 * tq;
      const float2 x = h0 ? *reinterpret_cast<const float2*>(h0 + at + (long)r * V + c)
                          : make_float2(0.f, 0.f);
      s[0][nt][2 * hf] = x.x;
      s[0][nt][2 * hf + 1] = x.y;
    }
  if (!prod) wait_for_primary();  // the computing warps copy prepare's workspace themselves
  if (sq.nc > 0 && !prod) {
    issue(0, All{}, tid, false);
    issue_q(0, All{}, tid, false);
    if constexpr (M::lean) issue_t(0, All{}, tid);
  }
  WB_CLK(0);
  for (int n = 0; n < sq.nc; ++n) {
    const int t0 = sq.first + n * kC, L = gdn::imin(kC, tend - t0);
    // the state before this chunk, rounded, to shared memory (the B operand of K S and Q S)
#pragma unroll
    for (int nt = 0; nt < NT3; ++nt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int r = r3 + gq + 8 * hf, c = n3 + nt * 8 + 2 * tq;
        Ss[c * SST + r] = rtf32(s[0][nt][2 * hf]);
        Ss[(c + 1) * SST + r] = rtf32(s[0][nt][2 * hf + 1]);
      }
    WB_CLK(1);
    if constexpr (M::lean) cp_wait<1>();  // all but this chunk's Tinv and PT
    else cp_wait<0>();
    __syncthreads();  // this chunk's inputs and S are in place; the other stage is free
    WB_CLK(2);
    if (n + 1 < sq.nc && !prod) issue(n + 1, All{}, tid, false);
    WB_CLK(3);
    const QT* Kc = reinterpret_cast<const QT*>(sm + M::keys(n));
    const QT* Vc = reinterpret_cast<const QT*>(sm + M::vals(n));
    const float* Tc = sm + M::tinv(n);  // Tinv, then PT
    // the chunk's factors: exp(gc) nk, exp(gc) nq, beta, exp(gc_last - gc) nk, exp(gc_last)
    const float *fek = sm + M::facs(n), *feq = fek + kC, *fbt = feq + kC, *fd = fbt + kC;
    float o1[1][2][4];  // exp(gc_i) nq_i (Q S)_i, the inter-chunk part of o
    const float* sbn = Ss + n1 * SST;
    if constexpr (!kHalf) {
      // K S and Q S, each as two independent chains over K / 2, sharing S's fragments
      float x[1][2][4], x2[1][2][4], y[1][2][4], y2[1][2][4];
      zero(x);
      zero(x2);
      zero(y);
      zero(y2);
      if constexpr (is_f32<QT>) {
        gemm_pair<2, K / 2, SKK, 1, 1, SST, true, false>(x, y, Kc + r1 * SKK, Qs + r1 * SQ, sbn,
                                                         0, lane);
        gemm_pair<2, K / 2, SKK, 1, 1, SST, true, false>(
            x2, y2, Kc + r1 * SKK + K / 2, Qs + r1 * SQ + K / 2, sbn + K / 2, 0, lane);
      } else {  // 16-bit keys and queries: A fragments by ldmatrix
        gemm_pair16<2, K / 2, SKK, SST>(x, y, Kc + r1 * SKK, Qs + r1 * SQ, sbn, lane);
        gemm_pair16<2, K / 2, SKK, SST>(x2, y2, Kc + r1 * SKK + K / 2, Qs + r1 * SQ + K / 2,
                                        sbn + K / 2, lane);
      }
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int i = r1 + gq + 8 * hf;
        const float ek = fek[i], eq = feq[i], bi = fbt[i];
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          const int c = n1 + nt * 8 + 2 * tq;
          const float2 vv = ld2(Vc + i * P::SVT + c);
          const float k0 = x[0][nt][2 * hf] + x2[0][nt][2 * hf];
          const float k1 = x[0][nt][2 * hf + 1] + x2[0][nt][2 * hf + 1];
          *reinterpret_cast<float2*>(Rs + i * SR + c) =
              make_float2(rtf32(bi * (vv.x - ek * k0)), rtf32(bi * (vv.y - ek * k1)));
          o1[0][nt][2 * hf] = eq * (y[0][nt][2 * hf] + y2[0][nt][2 * hf]);
          o1[0][nt][2 * hf + 1] = eq * (y[0][nt][2 * hf + 1] + y2[0][nt][2 * hf + 1]);
        }
      }
    } else {
      // K S (warps 0-3) or Q S (warps 4-7), two chains over K / 2 as above
      float x[1][2][4], x2[1][2][4];
      zero(x);
      zero(x2);
      const QT* A = qrole ? Qs + r1 * SQ : Kc + r1 * SKK;
      if constexpr (is_f32<QT>) {
        gemm_one<2, K / 2, SKK, 1, 1, SST, true, false>(x, A, sbn, 0, lane);
        gemm_one<2, K / 2, SKK, 1, 1, SST, true, false>(x2, A + K / 2, sbn + K / 2, 0, lane);
      } else {
        gemm_one16<2, K / 2, SKK, SST>(x, A, sbn, lane);
        gemm_one16<2, K / 2, SKK, SST>(x2, A + K / 2, sbn + K / 2, lane);
      }
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int i = r1 + gq + 8 * hf;
        if (!qrole) {
          const float ek = fek[i], bi = fbt[i];
#pragma unroll
          for (int nt = 0; nt < 2; ++nt) {
            const int c = nt * 8 + 2 * tq;
            const float2 vv = ld2(Vc + i * P::SVT + c);
            const float k0 = x[0][nt][2 * hf] + x2[0][nt][2 * hf];
            const float k1 = x[0][nt][2 * hf + 1] + x2[0][nt][2 * hf + 1];
            *reinterpret_cast<float2*>(Rs + i * SR + c) =
                make_float2(rtf32(bi * (vv.x - ek * k0)), rtf32(bi * (vv.y - ek * k1)));
          }
        } else {
          const float eq = feq[i];
#pragma unroll
          for (int nt = 0; nt < 2; ++nt) {
            o1[0][nt][2 * hf] = eq * (x[0][nt][2 * hf] + x2[0][nt][2 * hf]);
            o1[0][nt][2 * hf + 1] = eq * (x[0][nt][2 * hf + 1] + x2[0][nt][2 * hf + 1]);
          }
        }
      }
    }
    WB_CLK(4);
    if constexpr (M::lean) {  // this chunk's Tinv and PT (the next chunk's keys may be in flight)
      if (n + 1 < sq.nc) cp_wait<1>();
      else cp_wait<0>();
    }
    __syncthreads();  // R is complete; every warp is done with the queries (and V)
    WB_CLK(5);
    if (n + 1 < sq.nc && !prod) issue_q(n + 1, All{}, tid, false);
    WB_CLK(6);
    {  // U = Tinv R and PT R (both lower triangular: depth r1 + 16)
      float u[1][2][4], y[1][2][4];
      zero(u);
      zero(y);
      if constexpr (!kHalf)  // sharing R's fragments
        gemm_pair<2, 0, kPS, 1, SR, 1, false, false>(u, y, Tc + r1 * kPS, Tc + (kC + r1) * kPS,
                                                     Rs + n1, r1 + 16, lane);
      else if (!qrole)
        gemm_one<2, 0, kPS, 1, SR, 1, false, false>(u, Tc + r1 * kPS, Rs, r1 + 16, lane);
      else
        gemm_one<2, 0, kPS, 1, SR, 1, false, false>(y, Tc + (kC + r1) * kPS, Rs, r1 + 16, lane);
      if (!qrole) {
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int i = r1 + gq + 8 * hf;
          const float d = fd[i];
#pragma unroll
          for (int nt = 0; nt < 2; ++nt) {
            const int c = n1 + nt * 8 + 2 * tq;
            Ud[c * SUT + i] = rtf32(d * u[0][nt][2 * hf]);
            Ud[(c + 1) * SUT + i] = rtf32(d * u[0][nt][2 * hf + 1]);
          }
        }
      }
      if (!kHalf || qrole) {
        // o: this thread's rows r1 + gq (+8), column pairs n1 + 8 nt + 2 tq
        const long orow = gdn::v_index(b, t0 + r1 + gq, hv, T, HV, V) + c0 + n1 + 2 * tq;
        with_out_type(o, odt, [&](auto* op) {
#pragma unroll
          for (int hf = 0; hf < 2; ++hf) {
            if (r1 + gq + 8 * hf >= L) continue;
            auto* p = op + orow + (long)(8 * hf) * HV * V;
#pragma unroll
            for (int nt = 0; nt < 2; ++nt)
              put2(p + 8 * nt, scale * (o1[0][nt][2 * hf] + y[0][nt][2 * hf]),
                   scale * (o1[0][nt][2 * hf + 1] + y[0][nt][2 * hf + 1]));
          }
        });
      }
    }
    WB_CLK(7);
    __syncthreads();  // Ud is complete; every warp is done with Tinv and PT
    WB_CLK(8);
    if constexpr (M::lean)
      if (n + 1 < sq.nc && !prod) issue_t(n + 1, All{}, tid);
    // S <- exp(gc_last) S + K^T Ud (A(i, j) = K[j][i], raw keys rounded at the fragment load)
    const float el = fd[kC];
#pragma unroll
    for (int nt = 0; nt < NT3; ++nt)
#pragma unroll
      for (int r = 0; r < 4; ++r) s[0][nt][r] *= el;
    if constexpr (is_f32<QT>)
      gemm<1, NT3, kC, 1, SKK, 1, SUT, true, false>(s, Kc + r3, Ud + n3 * SUT, lane);
    else  // 16-bit keys: A fragments by transposing ldmatrix
      gemm16t<NT3, kC, SKK, SUT>(s, Kc + r3, Ud + n3 * SUT, lane);
    WB_CLK(9);
    WB_CLK_COUNT();
  }
#pragma unroll
  for (int nt = 0; nt < NT3; ++nt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int r = r3 + gq + 8 * hf, c = n3 + nt * 8 + 2 * tq;
      *reinterpret_cast<float2*>(st + (long)r * V + c) =
          make_float2(s[0][nt][2 * hf], s[0][nt][2 * hf + 1]);
    }
}

// ----------------------------------------------------------------- the wgmma pass (K = V = 128)
//
// WORKBENCH_GDN_MMA_PASS=wgmma (forced only; K = V = 128 with bf16 q, k, v, else the shared-memory
// pass): the first step of the fused kernel (docs/kernels/gdn.md, next steps (3)). A block of two
// warpgroups per (sequence, value head) holds the state transposed, S^T [V, K], 64 value rows a
// warpgroup, in wgmma accumulators for the whole sequence, and reads prepare's workspace as the
// other passes do. Per chunk, on bf16 operands in two halves (hi = bf16(x), lo = bf16(x - hi))
// where they are not bf16 already (the accuracy model's `fused-x2s`): X = S^T K^T and
// Y = S^T Q^T (S^T's halves against the chunk's keys and queries as given); on the accumulators'
// columns (positions c) R^T = beta_c (V^T - ek_c X) and Y *= eq_c; U^T = R^T Tinv^T and
// Y += R^T PT^T (Tinv and PT, tf32 values, split exactly into two bf16 halves); o = scale Y;
// S^T = el S^T + (U^T diag(d)) K (the same key tile read MN-major: bf16's transpose flag).
// Twelve bf16 products a chunk. The chunk's tiles come by cp.async a chunk ahead into the other
// of two stages, straight into their 128-byte swizzle (16-byte units, which the swizzle moves
// whole): the keys and queries as given, Tinv's and PT's halves as prepare writes them for this
// pass (put_ws), V and the factor rows; one block barrier a chunk.
namespace wgp {
constexpr int SVS = 128 + 8;  // V's row stride (elements)
// a stage (1024-byte aligned for the swizzle): keys, queries, Tinv's and PT's bf16 halves (K-major
// tiles; Tinv's and PT's rows: the output position), V (rows c), the factor rows; two stages
constexpr int Kt = 0, Qt = Kt + 16384, Th = Qt + 16384, Tl = Th + 8192, Ph = Tl + 8192, Pl = Ph + 8192,
              Vs = Pl + 8192, F = Vs + kC * SVS * 2, stage = (F + kFacRows * kC * 4 + 1023) / 1024 * 1024,
              bytes = 2 * stage;
}  // namespace wgp

// A warp-specialised block's producer: chunk n's copies (issue(n, st), one commit group) into
// stage st = n % 2 once its consumers are done with chunk n - 2 (they arrive at named barrier
// empty0 + st, this one waits there with them: N threads), then, once the copies have landed and
// are visible to the async proxy, full(st) (its arrivals at the consumers' FULL barriers).
template <int N, typename Issue, typename Full>
__device__ __forceinline__ void produce_stages(int nc, int empty0, Issue&& issue, Full&& full) {
  for (int n = 0; n < nc; ++n) {
    const int st = n & 1;
    if (n >= 2) named_sync<N>(empty0 + st);
    issue(n, st);
    cp_wait<0>();
    wbmma::fence_async_smem();  // visible to wgmma (the async proxy)
    full(st);
  }
}

// The wgmma pass's two forms (WORKBENCH_GDN_MMA_WG, read at each launch; A/Bs): WS false, the
// two computing warpgroups issue the copies too and meet at a block barrier each chunk ("sync",
// the second version); WS true, warp-specialised: a third warpgroup only copies (setmaxnreg moves
// its registers to the two that compute) and the computing warpgroups meet no barrier but the
// stages' (named barriers: FULL(st, wg) when the producer's copies of a chunk into stage st have
// landed, the producer and that warpgroup's 128 threads; EMPTY(st) when both warpgroups are done
// with it, all 384), so each runs at its own pace ("ws"); pp: the two also take turns to issue
// their products (two more named barriers), so that one's products run on the tensor cores while
// the other works on its registers ("pingpong"). Every thread's arithmetic is the same in all
// three: the same bits.
constexpr int kWgFull = 1, kWgEmpty = 5, kWgTurn = 7;  // named barrier ids: 1-4, 5-6, 7-8
template <typename QT, bool WS>
__global__ void __launch_bounds__(WS ? 384 : 256, 1)
mma_wgpass(const QT* __restrict__ q, const QT* __restrict__ k, const QT* __restrict__ v,
           const float* __restrict__ tinv, const float* h0, float* state, void* __restrict__ o,
           int T, int H, int HV, int V, float scale, int odt, int NC, const Packed pk, int pp) {
  static_assert(sizeof(QT) == 2, "16-bit q, k, v");
  using namespace wbtile;
  constexpr int K = 128;
  WB_DYNAMIC_SMEM(float4, smem4);
  uint8_t* raw = reinterpret_cast<uint8_t*>(smem4);
  const uint32_t sa0 = wbmma::smem_u32(raw), pad = (1024 - sa0 % 1024) % 1024, sb = sa0 + pad;
  uint8_t* sm = raw + pad;
  const PassBlock pb = pass_block(pk, HV);
  const SeqAt sq = pass_seq(pk, pb.x, HV, T, NC);
  const int b = sq.b, hv = pb.x % HV, h = hv / (HV / H), tend = sq.first + sq.len;
  const int tid = threadIdx.x, wg = tid / 128, w = (tid % 128) / 32, g = (tid % 32) / 4, tq = tid % 4;
  // chunk n's tiles into stage st, by the nth threads (id: this one's index among them), one
  // commit group; rows c >= L zero
  auto issue = [&](int n, int st, int id, auto nth) {
    constexpr int NTH = decltype(nth)::value;
    const int t0 = sq.first + n * kC, L = gdn::imin(kC, tend - t0);
    const float* ws = tinv + (sq.crow + n) * kChunkWs;
    uint8_t* d = sm + st * wgp::stage;
    const uint32_t ds = sb + st * wgp::stage;
    for (int i = id; i < kC * 16; i += NTH) {  // row c, the 16-byte piece j of k (or of V's row)
      const int c = i / 16, j = i % 16;
      const uint32_t ok = wgp::Kt + b_offset<2>(8 * j, c, kC), oq = wgp::Qt + b_offset<2>(8 * j, c, kC),
                     ov = wgp::Vs + 2 * (c * wgp::SVS + 8 * j);
      if (c < L) {
        const long qk = gdn::qk_index(b, t0 + c, h, T, H, K) + 8 * j;
        cp16(d + ok, ds + ok, k + qk);
        cp16(d + oq, ds + oq, q + qk);
        cp16(d + ov, ds + ov, v + gdn::v_index(b, t0 + c, hv, T, HV, V) + 8 * j);
      } else {
        const uint4 z = make_uint4(0, 0, 0, 0);
        *reinterpret_cast<uint4*>(d + ok) = z, *reinterpret_cast<uint4*>(d + oq) = z,
        *reinterpret_cast<uint4*>(d + ov) = z;
      }
    }
    // Tinv's and PT's halves: four 64 x 64 bf16 matrices (hi, lo, hi, lo), row r's 16-byte piece j
    for (int i = id; i < 4 * kC * 8; i += NTH) {
      const int m = i / (kC * 8), r = (i / 8) % kC, j = i % 8;
      const uint32_t ot = wgp::Th + m * 8192 + b_offset<2>(8 * j, r, kC);
      cp16(d + ot, ds + ot, reinterpret_cast<const uint8_t*>(ws) + m * 8192 + r * 128 + 16 * j);
    }
    for (int i = id; i < kFacRows * kC / 4; i += NTH)
      cp16(d + wgp::F + 16 * i, ds + wgp::F + 16 * i, ws + kFac + 4 * i);
    cp_commit();
  };
  if constexpr (WS) {
    if (wg == 2) {  // the producer: chunk n into stage n % 2 once both warpgroups are done with n - 2
      wbmma::setmaxnreg_dec<40>();
      wait_for_primary();  // prepare's workspace complete (a dependent launch; else nothing)
      produce_stages<384>(sq.nc, kWgEmpty, [&](int n, int st) {
        issue(n, st, tid - 256, std::integral_constant<int, 128>{});
      }, [&](int st) {
        named_arrive<256>(kWgFull + 2 * st);
        named_arrive<256>(kWgFull + 2 * st + 1);
      });
      return;
    }
    wbmma::setmaxnreg_inc<232>();
  }
  // accumulator register i: the value row (the state's v, o's column) and the column (k, or c)
  auto vrow = [&](int i) { return 64 * wg + 16 * w + g + 8 * ((i / 2) % 2); };
  auto ccol = [&](int i) { return 8 * (i / 4) + 2 * tq + i % 2; };
  const long at = gdn::state_index(sq.sb, hv, HV, K, V);
  float s[2][32];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh)
#pragma unroll
    for (int i = 0; i < 32; ++i) s[hh][i] = h0 ? h0[at + (long)(64 * hh + ccol(i)) * V + vrow(i)] : 0.0f;
  if constexpr (!WS) wait_for_primary();
  // ping-pong: this warpgroup's turn to issue products (barrier kWgTurn + wg: its 128 threads wait,
  // the other's arrive once they have issued theirs); warpgroup 1 lets warpgroup 0 go first
  const bool turns = WS && pp && sq.nc > 0;
  auto my_turn = [&]() {
    if (turns) named_sync<256>(kWgTurn + wg);
  };
  auto their_turn = [&](bool last) {
    if (turns && !(last && wg == 1)) named_arrive<256>(kWgTurn + (wg ^ 1));
  };
  if (turns && wg == 1) named_arrive<256>(kWgTurn);
  float x[32], y[32], u[32];
  uint32_t sh[8][4], sl[8][4], ah[4][4], al[4][4];
  auto fence_all = [&]() { fence_regs(s[0]), fence_regs(s[1]), fence_regs(x), fence_regs(y), fence_regs(u); };
  if (!WS && sq.nc > 0) issue(0, 0, tid, std::integral_constant<int, 256>{});
  for (int n = 0; n < sq.nc; ++n) {
    const int t0 = sq.first + n * kC, L = gdn::imin(kC, tend - t0), st = n & 1;
    const uint8_t* stg = sm + st * wgp::stage;
    const uint32_t sbs = sb + st * wgp::stage;
    if constexpr (WS) {
      named_sync<256>(kWgFull + 2 * st + wg);  // the producer's copies of chunk n have landed
    } else {
      cp_wait<0>();     // this thread's copies of chunk n
      wbmma::fence_async_smem();  // visible to wgmma (the async proxy)
      __syncthreads();  // everyone's; and every warp is done with chunk n - 1 (its stage)
      if (n + 1 < sq.nc) issue(n + 1, st ^ 1, tid, std::integral_constant<int, 256>{});
    }
    const float* fac = reinterpret_cast<const float*>(stg + wgp::F);
    const QT* Vs = reinterpret_cast<const QT*>(stg + wgp::Vs);
    const float *fek = fac, *feq = fac + kC, *fbt = fac + 2 * kC, *fd = fac + 3 * kC;
    // X = S^T K^T, Y = S^T Q^T
    frags<1, 64>(s[0], sh), frags<1, 64>(s[1], sh, 4);
    frags_lo<64>(s[0], sl), frags_lo<64>(s[1], sl, 4);
#pragma unroll
    for (int i = 0; i < 32; ++i) x[i] = y[i] = 0.0f;
    fence_all();
    my_turn();
    wbmma::wgmma_fence();
    product<1, K>(x, sh, sbs + wgp::Kt, kC, 0, false);
    product<1, K>(x, sl, sbs + wgp::Kt, kC, 0, true);
    product<1, K>(y, sh, sbs + wgp::Qt, kC, 0, false);
    product<1, K>(y, sl, sbs + wgp::Qt, kC, 0, true);
    wbmma::wgmma_commit();
    their_turn(false);
    wbmma::wgmma_wait<0>();
    fence_all();
    // R^T = beta (V^T - ek X) into x; Y *= eq
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const int c = ccol(i);
      x[i] = fbt[c] * (to_f(Vs[c * wgp::SVS + vrow(i)]) - fek[c] * x[i]);
      y[i] *= feq[c];
      u[i] = 0.0f;
    }
    frags<1, kC>(x, ah);
    frags_lo<kC>(x, al);
    fence_all();
    my_turn();
    wbmma::wgmma_fence();
    product<1, kC>(u, ah, sbs + wgp::Th, kC, 0, false);
    product<1, kC>(u, ah, sbs + wgp::Tl, kC, 0, true);
    product<1, kC>(u, al, sbs + wgp::Th, kC, 0, true);
    product<1, kC>(y, ah, sbs + wgp::Ph, kC, 0, true);
    product<1, kC>(y, ah, sbs + wgp::Pl, kC, 0, true);
    product<1, kC>(y, al, sbs + wgp::Ph, kC, 0, true);
    wbmma::wgmma_commit();
    their_turn(false);
    wbmma::wgmma_wait<0>();
    fence_all();
    // o = scale Y (positions c < L)
    with_out_type(o, odt, [&](auto* op) {
#pragma unroll
      for (int i = 0; i < 32; ++i)
        if (ccol(i) < L) put(op + gdn::v_index(b, t0 + ccol(i), hv, T, HV, V) + vrow(i), scale * y[i]);
    });
    // S^T = el S^T + (U^T diag(d)) K (the key tile MN-major: B(k = c, n = the state's k))
    const float el = fac[4 * kC];
#pragma unroll
    for (int i = 0; i < 32; ++i) u[i] *= fd[ccol(i)];
    frags<1, kC>(u, ah);
    frags_lo<kC>(u, al);
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
#pragma unroll
      for (int i = 0; i < 32; ++i) s[hh][i] *= el;
    fence_all();
    my_turn();
    wbmma::wgmma_fence();
    product_t<kC>(s[0], ah, sbs + wgp::Kt, kC, 0, true);
    product_t<kC>(s[1], ah, sbs + wgp::Kt, kC, 64, true);
    product_t<kC>(s[0], al, sbs + wgp::Kt, kC, 0, true);
    product_t<kC>(s[1], al, sbs + wgp::Kt, kC, 64, true);
    wbmma::wgmma_commit();
    their_turn(n + 1 == sq.nc);
    wbmma::wgmma_wait<0>();
    fence_all();
    if constexpr (WS)
      if (n + 2 < sq.nc) named_arrive<384>(kWgEmpty + st);  // this warpgroup is done with stage st
  }
#pragma unroll
  for (int hh = 0; hh < 2; ++hh)
#pragma unroll
    for (int i = 0; i < 32; ++i) state[at + (long)(64 * hh + ccol(i)) * V + vrow(i)] = s[hh][i];
}

// ---------------------------------------------------- the column wgmma pass (K = 64 or 128)
//
// WORKBENCH_GDN_MMA_PASS=wgcols (forced only; bf16 q, k, v, else the shared-memory pass): one
// warpgroup a block per (sequence, value head, BV value columns), the state S [K, BV] untransposed
// in wgmma accumulators (K / 64 tiles of 64 x BV: BV / 2 registers a tile), so that the value
// columns are the products' N and a head's columns spread over V / BV blocks (B1 HV32 at
// K = V = 64: 128 blocks of 16 columns). Per chunk, bf16 operands in two halves (hi = bf16(x),
// lo = bf16(x - hi)) where they are not bf16 already, as the wgmma pass's: A from registers
// (ldmatrix of the chunk's tiles as given, or prepare's Tinv / PT halves), B the block's own
// C x BV intermediates in shared memory, n-contiguous (MN-major, no swizzle: the transpose flag):
//   X = K S, Y = Q S                      (A: keys, queries; B: S's halves)
//   R = beta (V - ek X), Y *= eq          (to shared memory in halves)
//   U = Tinv R, Y += PT R                 (A: Tinv's and PT's halves; B: R's; three products each)
//   o = scale Y; S = el S + K^T (d U)     (A: the keys transposed by ldmatrix; B: d U's halves)
// Two cp.async stages a chunk ahead (keys, queries, Tinv's and PT's halves, V's BV columns, the
// factor rows), issued by a fifth warp (PROD; named barriers FULL / EMPTY a stage between it and
// the warpgroup) or, with WORKBENCH_GDN_MMA_COPY=warps, by the warpgroup itself; three warpgroup
// barriers a chunk (the B operands written by the threads, then read by the warpgroup's wgmma).
// The same bits either way.
namespace wcp {
// bytes: a stage's keys and queries (row stride K + 8 elements), Tinv hi / lo, PT hi / lo (row
// stride 72), V's columns (rows of BV), the factor rows; then S's, R's and d U's halves
template <int K, int BV>
struct Smem {
  static constexpr int SK = K + 8, ST = kC + 8;
  static constexpr int Ks = 0, Qs = Ks + kC * SK * 2, T4 = Qs + kC * SK * 2, Vs = T4 + 4 * kC * ST * 2,
                       F = Vs + kC * BV * 2, stage = (F + kFacRows * kC * 4 + 127) / 128 * 128;
  static constexpr int Sb = 2 * stage, Rb = Sb + 2 * K * BV * 2, Ub = Rb + 2 * kC * BV * 2,
                       bytes = Ub + 2 * kC * BV * 2;
};
// byte offset of element (k, n) of a B operand of N columns read MN-major without swizzle: core
// matrices of 8 k x 16 bytes of n, pieces of n 128 bytes apart, groups of 8 k N / 8 x 128 apart
template <int N>
__device__ __forceinline__ int b_mn(int k, int n) {
  return (k / 8) * (N / 8) * 128 + (n / 8) * 128 + (k % 8) * 16 + (n % 8) * 2;
}
template <int N>
__device__ __forceinline__ uint64_t desc_mn(uint32_t sa, int j) {  // k step j (16 k)
  return wbmma::smem_desc(sa + (uint32_t)j * 2 * (N / 8) * 128, (N / 8) * 128, 128, 0);
}
}  // namespace wcp

constexpr int kWcFull = 1, kWcEmpty = 3, kWcBar = 5;  // named barriers of the producer form
template <int K, int BV, bool PROD>
__global__ void __launch_bounds__(PROD ? 160 : 128, 1)
mma_wcpass(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
           const __nv_bfloat16* __restrict__ v, const float* __restrict__ tinv, const float* h0,
           float* state, void* __restrict__ o, int T, int H, int HV, int V, float scale, int odt,
           int NC, const Packed pk) {
  using M = wcp::Smem<K, BV>;
  using wbtile::bf16x2;
  using wbtile::bf16_rest;
  constexpr int MT = K / 64, NR = BV / 2, SK = M::SK, ST = M::ST;
  WB_DYNAMIC_SMEM(float4, smem4);
  uint8_t* sm = reinterpret_cast<uint8_t*>(smem4);
  const uint32_t sb = wbmma::smem_u32(sm);
  const PassBlock pb = pass_block(pk, HV);
  const SeqAt sq = pass_seq(pk, pb.x, HV, T, NC);
  const int b = sq.b, hv = pb.x % HV, h = hv / (HV / H), c0 = pb.y * BV;
  const int tend = sq.first + sq.len;
  const int tid = threadIdx.x, lane = tid % 32, w = tid / 32, g = lane / 4, tq = lane % 4;
  // accumulator register i of a 64 x BV tile: row 16 w + g + 8 ((i / 2) % 2), column 8 (i / 4) + 2 tq + i % 2
  auto arow = [&](int i) { return 16 * w + g + 8 * ((i / 2) % 2); };
  auto acol = [&](int i) { return 8 * (i / 4) + 2 * tq + i % 2; };
  // chunk n's tiles into stage st by the NTH threads (id: this one's index among them), one commit
  // group; rows c >= L of k, q and V zero
  auto issue = [&](int n, int st, int id, auto nth) {
    constexpr int NTH = decltype(nth)::value;
    const int t0 = sq.first + n * kC, L = gdn::imin(kC, tend - t0);
    const float* ws = tinv + (sq.crow + n) * kChunkWs;
    uint8_t* d = sm + st * M::stage;
    const uint32_t ds = sb + st * M::stage;
    for (int i = id; i < kC * K / 8; i += NTH) {  // row c, 16-byte piece j of its keys and queries
      const int c = i / (K / 8), j = i % (K / 8);
      const int ok = M::Ks + 2 * (c * SK + 8 * j), oq = M::Qs + 2 * (c * SK + 8 * j);
      if (c < L) {
        const long qk = gdn::qk_index(b, t0 + c, h, T, H, K) + 8 * j;
        cp16(d + ok, ds + ok, k + qk);
        cp16(d + oq, ds + oq, q + qk);
      } else {
        *reinterpret_cast<uint4*>(d + ok) = make_uint4(0, 0, 0, 0);
        *reinterpret_cast<uint4*>(d + oq) = make_uint4(0, 0, 0, 0);
      }
    }
    for (int i = id; i < kC * BV / 8; i += NTH) {  // V's columns c0.., row c, piece j
      const int c = i / (BV / 8), j = i % (BV / 8), ov = M::Vs + 2 * (c * BV + 8 * j);
      if (c < L) cp16(d + ov, ds + ov, v + gdn::v_index(b, t0 + c, hv, T, HV, V) + c0 + 8 * j);
      else *reinterpret_cast<uint4*>(d + ov) = make_uint4(0, 0, 0, 0);
    }
    // Tinv's and PT's halves (prepare's bf16 matrices: hi, lo, hi, lo, rows of 128 bytes)
    for (int i = id; i < 4 * kC * 8; i += NTH) {
      const int m = i / (kC * 8), r = (i / 8) % kC, j = i % 8, ot = M::T4 + 2 * ((m * kC + r) * ST + 8 * j);
      cp16(d + ot, ds + ot, reinterpret_cast<const uint8_t*>(ws) + m * 8192 + r * 128 + 16 * j);
    }
    for (int i = id; i < kFacRows * kC / 4; i += NTH)
      cp16(d + M::F + 16 * i, ds + M::F + 16 * i, ws + kFac + 4 * i);
    cp_commit();
  };
  // an accumulator tile's halves into the MN-major B operand at byte offset hi (lo: + half), row
  // offset r0 (S's tiles: 64 mt)
  auto put_b = [&](const float (&d)[NR], int hi, int half, int r0) {
#pragma unroll
    for (int i = 0; i < NR; i += 2) {
      const int at = hi + wcp::b_mn<BV>(r0 + arow(i), acol(i));
      *reinterpret_cast<uint32_t*>(sm + at) = bf16x2(d[i], d[i + 1]);
      *reinterpret_cast<uint32_t*>(sm + at + half) = bf16x2(bf16_rest(d[i]), bf16_rest(d[i + 1]));
    }
  };
  constexpr int SH = K * BV * 2, CH = kC * BV * 2;  // bytes of one half: S's, R's / d U's
  using Mine = std::integral_constant<int, 128>;
  if constexpr (PROD) {  // a fifth warp issues the copies: chunk n into stage n % 2 once the
                         // warpgroup is done with chunk n - 2 (EMPTY), then FULL once landed
    if (w == 4) {
      wait_for_primary();  // prepare's workspace complete (a dependent launch; else nothing)
      produce_stages<160>(sq.nc, kWcEmpty, [&](int n, int st) {
        issue(n, st, lane, std::integral_constant<int, 32>{});
      }, [&](int st) { named_arrive<160>(kWcFull + st); });
      return;
    }
  }
  // the warpgroup's barrier (the producer form: a named one, the fifth warp not in it)
  auto wg_sync = [&]() {
    if constexpr (PROD) named_sync<128>(kWcBar);
    else __syncthreads();
  };
  const long at = gdn::state_index(sq.sb, hv, HV, K, V) + c0;
  float s[MT][NR];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int i = 0; i < NR; ++i) s[mt][i] = h0 ? h0[at + (long)(64 * mt + arow(i)) * V + acol(i)] : 0.0f;
  if constexpr (!PROD) wait_for_primary();
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) put_b(s[mt], M::Sb, SH, 64 * mt);
  if (!PROD && sq.nc > 0) issue(0, 0, tid, Mine{});
  float x[NR], y[NR], u[NR];
  uint32_t ak[K / 16][4], aq[K / 16][4], at4[4][4][4];
  auto fence_all = [&]() {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) wbtile::fence_regs(s[mt]);
    wbtile::fence_regs(x), wbtile::fence_regs(y), wbtile::fence_regs(u);
  };
  for (int n = 0; n < sq.nc; ++n) {
    const int t0 = sq.first + n * kC, L = gdn::imin(kC, tend - t0), st = n & 1;
    uint8_t* stg = sm + st * M::stage;
    if constexpr (PROD) {
      wbmma::fence_async_smem();  // S's halves visible to wgmma (the async proxy)
      named_sync<160>(kWcFull + st);  // chunk n's copies have landed; S's halves complete
    } else {
      cp_wait<0>();               // this thread's copies of chunk n
      wbmma::fence_async_smem();  // they and S's halves visible to wgmma (the async proxy)
      __syncthreads();            // everyone's; every thread is done with chunk n - 1's stage
      if (n + 1 < sq.nc) issue(n + 1, st ^ 1, tid, Mine{});
    }
    const float* fac = reinterpret_cast<const float*>(stg + M::F);
    const __nv_bfloat16* Vc = reinterpret_cast<const __nv_bfloat16*>(stg + M::Vs);
    const float *fek = fac, *feq = fac + kC, *fbt = fac + 2 * kC, *fd = fac + 3 * kC;
    // the keys' and queries' A fragments: rows 16 w.., k step j
#pragma unroll
    for (int j = 0; j < K / 16; ++j) {
      const int r = 16 * w + lane % 8 + 8 * ((lane / 8) % 2), c = 16 * j + 8 * (lane / 16);
      ldsm4<false>(ak[j], stg + M::Ks + 2 * (r * SK + c));
      ldsm4<false>(aq[j], stg + M::Qs + 2 * (r * SK + c));
    }
#pragma unroll
    for (int i = 0; i < NR; ++i) x[i] = y[i] = 0.0f;
    fence_all();
    wbmma::wgmma_fence();
#pragma unroll
    for (int j = 0; j < K / 16; ++j) {
      wbmma::wgmma_bf16<BV, true>(x, ak[j], wcp::desc_mn<BV>(sb + M::Sb, j), j > 0);
      wbmma::wgmma_bf16<BV, true>(x, ak[j], wcp::desc_mn<BV>(sb + M::Sb + SH, j), true);
      wbmma::wgmma_bf16<BV, true>(y, aq[j], wcp::desc_mn<BV>(sb + M::Sb, j), j > 0);
      wbmma::wgmma_bf16<BV, true>(y, aq[j], wcp::desc_mn<BV>(sb + M::Sb + SH, j), true);
    }
    wbmma::wgmma_commit();
    wbmma::wgmma_wait<0>();
    fence_all();
    // R = beta (V - ek X) to shared memory in halves; Y *= eq
#pragma unroll
    for (int i = 0; i < NR; ++i) {
      const int c = arow(i);
      x[i] = fbt[c] * (to_f(Vc[c * BV + acol(i)]) - fek[c] * x[i]);
      y[i] *= feq[c];
      u[i] = 0.0f;
    }
    put_b(x, M::Rb, CH, 0);
    // Tinv's and PT's A fragments (rows 16 w.., k step j)
#pragma unroll
    for (int m = 0; m < 4; ++m)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int r = 16 * w + lane % 8 + 8 * ((lane / 8) % 2), c = 16 * j + 8 * (lane / 16);
        ldsm4<false>(at4[m][j], stg + M::T4 + 2 * ((m * kC + r) * ST + c));
      }
    wbmma::fence_async_smem();
    wg_sync();  // R's halves complete
    fence_all();
    wbmma::wgmma_fence();
#pragma unroll
    for (int j = 0; j < 4; ++j) {  // U = Tinv R, Y += PT R: hi hi, hi lo, lo hi
      const uint64_t rh = wcp::desc_mn<BV>(sb + M::Rb, j), rl = wcp::desc_mn<BV>(sb + M::Rb + CH, j);
      wbmma::wgmma_bf16<BV, true>(u, at4[0][j], rh, true);
      wbmma::wgmma_bf16<BV, true>(u, at4[0][j], rl, true);
      wbmma::wgmma_bf16<BV, true>(u, at4[1][j], rh, true);
      wbmma::wgmma_bf16<BV, true>(y, at4[2][j], rh, true);
      wbmma::wgmma_bf16<BV, true>(y, at4[2][j], rl, true);
      wbmma::wgmma_bf16<BV, true>(y, at4[3][j], rh, true);
    }
    wbmma::wgmma_commit();
    wbmma::wgmma_wait<0>();
    fence_all();
    // o = scale Y (positions c < L, column pairs)
    with_out_type(o, odt, [&](auto* op) {
#pragma unroll
      for (int i = 0; i < NR; i += 2)
        if (arow(i) < L)
          put2(op + gdn::v_index(b, t0 + arow(i), hv, T, HV, V) + c0 + acol(i), scale * y[i], scale * y[i + 1]);
    });
    // S = el S + K^T (d U): d U's halves to shared memory, then the keys transposed as A
    const float el = fac[4 * kC];
#pragma unroll
    for (int i = 0; i < NR; ++i) u[i] *= fd[arow(i)];
    put_b(u, M::Ub, CH, 0);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int i = 0; i < NR; ++i) s[mt][i] *= el;
    uint32_t kt[MT][4][4];  // A(k, c) = K[c][k]: rows 64 mt + 16 w.., k step j over positions
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int tile = lane / 8, c = 16 * j + lane % 8 + 8 * (tile / 2), kk = 64 * mt + 16 * w + 8 * (tile % 2);
        ldsm4<true>(kt[mt][j], stg + M::Ks + 2 * (c * SK + kk));
      }
    wbmma::fence_async_smem();
    wg_sync();  // d U's halves complete
    fence_all();
    wbmma::wgmma_fence();
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        wbmma::wgmma_bf16<BV, true>(s[mt], kt[mt][j], wcp::desc_mn<BV>(sb + M::Ub, j), true);
        wbmma::wgmma_bf16<BV, true>(s[mt], kt[mt][j], wcp::desc_mn<BV>(sb + M::Ub + CH, j), true);
      }
    wbmma::wgmma_commit();
    wbmma::wgmma_wait<0>();
    fence_all();
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) put_b(s[mt], M::Sb, SH, 64 * mt);  // for the next chunk
    if constexpr (PROD)
      if (n + 2 < sq.nc) named_arrive<160>(kWcEmpty + st);  // done with stage st
  }
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int i = 0; i < NR; i += 2)
      *reinterpret_cast<float2*>(state + at + (long)(64 * mt + arow(i)) * V + acol(i)) = make_float2(s[mt][i], s[mt][i + 1]);
}

// ------------------------------------------------------------------- the warp-resident pass

// One stage of the warp-resident pass (two, alternating): a chunk's keys and queries (QT, as
// given), Tinv and PT (tf32, from prepare; their lower block triangles), the block's 16 NW value
// columns (QT) and the chunk's factor rows (kFac). Offsets in floats.
template <int K, typename QT, int NW>
struct WarpStage {
  static constexpr int BV = 16 * NW, QB = (int)sizeof(QT);
  static constexpr int SKK = is_f32<QT> ? K + 4 : K + 8, SVT = is_f32<QT> ? BV + 4 : BV + 8;
  static constexpr int Kk = 0, Qq = Kk + kC * SKK * QB / 4, Tv = Qq + kC * SKK * QB / 4,
                       PTv = Tv + kC * kPS, Vt = PTv + kC * kPS, F = Vt + kC * SVT * QB / 4,
                       floats = F + kFacRows * kC;
  static_assert(Qq % 4 == 0 && Tv % 4 == 0 && Vt % 4 == 0 && F % 4 == 0, "16-byte stage rows");
};

// Pieces of the two register-state passes (warp-resident and warp-pair). Fragment coordinates:
// gq = lane / 4, tq = lane % 4. A state accumulator s[j] holds column gq + 8 (r / 2) and state
// row k0 + 8 j + 2 tq + (r % 2); a chunk accumulator x[nt] position 8 nt + 2 tq + (r % 2).

// Issue one stage's copies (one commit group): the chunk's keys and queries at t0 (L rows, the
// rest zero), Tinv and PT and the factor rows from workspace row ws, and V's BV columns from vc.
template <int K, typename QT, int NW, int NTH>
__device__ __forceinline__ void issue_warp_stage(float* sb, const QT* q, const QT* k, const QT* v,
                                                 const float* ws, long qk0, long v0, int H, int HV,
                                                 int V, int L, int tid) {
  using P = WarpStage<K, QT, NW>;
  load_tile<kC, K, P::SKK, NTH>(reinterpret_cast<QT*>(sb + P::Kk), k + qk0, (long)H * K, L, tid);
  load_tile<kC, K, P::SKK, NTH>(reinterpret_cast<QT*>(sb + P::Qq), q + qk0, (long)H * K, L, tid);
  load_tri<2, NTH>(sb + P::Tv, ws, tid);  // Tinv and PT: their lower block triangles
  load_tile<kFacRows, kC, kC, NTH, true>(sb + P::F, ws + kFac, kC, kFacRows, tid);
  load_tile<kC, P::BV, P::SVT, NTH>(reinterpret_cast<QT*>(sb + P::Vt), v + v0, (long)HV * V, L,
                                    tid);
  cp_commit();
}

// NJ state accumulators from / to the state's rows k0 .. k0 + 8 NJ - 1 (st: the warp's column 0;
// loading from null: zeros).
template <int NJ>
__device__ __forceinline__ void load_state_rows(float (&s)[NJ][4], const float* st, int k0, int V,
                                                int gq, int tq) {
#pragma unroll
  for (int j = 0; j < NJ; ++j)
#pragma unroll
    for (int r = 0; r < 4; ++r)
      s[j][r] = st ? st[(long)(k0 + 8 * j + 2 * tq + (r & 1)) * V + gq + 8 * (r >> 1)] : 0.f;
}
template <int NJ>
__device__ __forceinline__ void store_state_rows(const float (&s)[NJ][4], float* st, int k0, int V,
                                                 int gq, int tq) {
#pragma unroll
  for (int j = 0; j < NJ; ++j)
#pragma unroll
    for (int r = 0; r < 4; ++r)
      st[(long)(k0 + 8 * j + 2 * tq + (r & 1)) * V + gq + 8 * (r >> 1)] = s[j][r];
}

// An accumulator tile as an A fragment, as it stands (already rounded where it needs to be).
__device__ __forceinline__ void acc_as_a(const float (&c)[4], uint32_t (&a)[4]) {
  a[0] = __float_as_uint(c[0]), a[1] = __float_as_uint(c[2]), a[2] = __float_as_uint(c[1]),
  a[3] = __float_as_uint(c[3]);
}

// (K S)^T and (Q S)^T over state rows k0 .. k0 + 8 NJ - 1, added to x and y: A = S^T from the
// accumulators (rounded to tf32 here), B(k = state row, n = position) = rows of the stage's K, Q.
template <int NJ, int SKK, typename QT>
__device__ __forceinline__ void state_times_kq(const float (&s)[NJ][4], const QT* Kc, const QT* Qc,
                                               int k0, float (&x)[8][4], float (&y)[8][4],
                                               int lane) {
  constexpr bool cq = is_f32<QT>;  // raw float32 q, k: rounded to tf32 at the fragment load
  const int gq = lane >> 2, tq = lane & 3;
#pragma unroll
  for (int j = 0; j < NJ; ++j) {
    const uint32_t a[4] = {opnd<true>(s[j][0]), opnd<true>(s[j][2]), opnd<true>(s[j][1]),
                           opnd<true>(s[j][3])};
    if constexpr (!cq) {  // 16-bit keys and queries: B fragments by ldmatrix, 4 n-tiles a load
#pragma unroll
      for (int h4 = 0; h4 < 2; ++h4) {
        uint32_t rk[4], rq[4];
        ldsm4<false>(rk, Kc + (32 * h4 + lane) * SKK + k0 + 8 * j);
        ldsm4<false>(rq, Qc + (32 * h4 + lane) * SKK + k0 + 8 * j);
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          uint32_t b0, b1;
          split16<QT>(rk[m], b0, b1);
          mma8(x[4 * h4 + m], a, b0, b1);
          split16<QT>(rq[m], b0, b1);
          mma8(y[4 * h4 + m], a, b0, b1);
        }
      }
    } else {
      const int kof = k0 + 8 * j + 2 * tq + gq * SKK;
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        uint32_t b0, b1;
        b_frag<1, cq>(Kc + kof + 8 * nt * SKK, b0, b1);
        mma8(x[nt], a, b0, b1);
        b_frag<1, cq>(Qc + kof + 8 * nt * SKK, b0, b1);
        mma8(y[nt], a, b0, b1);
      }
    }
  }
}

// acc^T += R^T M^T for a lower-triangular 64 x 64 M (row stride kPS) in shared memory, R^T in
// x (rounded): k-step ks feeds n-tiles >= ks only.
__device__ __forceinline__ void r_times_lower(const float (&x)[8][4], const float* M,
                                              float (&acc)[8][4], int gq, int tq) {
#pragma unroll
  for (int ks = 0; ks < 8; ++ks) {
    uint32_t a[4];
    acc_as_a(x[ks], a);
    const float* p = M + 8 * ks + 2 * tq + gq * kPS;
#pragma unroll
    for (int nt = ks; nt < 8; ++nt) {
      uint32_t b0, b1;
      b_frag<1, false>(p + 8 * nt * kPS, b0, b1);
      mma8(acc[nt], a, b0, b1);
    }
  }
}

// o = scale y^T: this thread's positions 8 nt + 2 tq (+1) < L (from orow, stride ost), columns
// gq (+8).
__device__ __forceinline__ void store_o_t(void* o, int odt, long orow, long ost, float scale,
                                          const float (&y)[8][4], int L, int tq) {
  with_out_type(o, odt, [&](auto* op) {
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        if (8 * nt + 2 * tq + e >= L) continue;
        auto* p = op + orow + (8 * nt + e) * ost;
        put(p, scale * y[nt][e]);
        put(p + 8, scale * y[nt][2 + e]);
      }
  });
}

// U^T <- the decayed, normed U^T (rounded): d = exp(gc_last - gc) nk per position.
__device__ __forceinline__ void decay_round(float (&u)[8][4], const float* d, int tq) {
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float di = d[8 * nt + 2 * tq + e];
      u[nt][e] = rtf32(di * u[nt][e]);
      u[nt][2 + e] = rtf32(di * u[nt][2 + e]);
    }
}

// S^T <- el S^T + Ud^T K over state rows k0 .. k0 + 8 NJ - 1: A = Ud^T (registers, rounded),
// B(k = position, n = state row) = K[position][row] (K's tiles transposed).
template <int NJ, int SKK, typename QT>
__device__ __forceinline__ void update_state(float (&s)[NJ][4], const float (&u)[8][4], float el,
                                             const QT* Kc, int k0, int lane) {
  constexpr bool cq = is_f32<QT>;
  const int gq = lane >> 2, tq = lane & 3;
#pragma unroll
  for (int j = 0; j < NJ; ++j)
#pragma unroll
    for (int r = 0; r < 4; ++r) s[j][r] *= el;
#pragma unroll
  for (int ks = 0; ks < 8; ++ks) {
    uint32_t a[4];
    acc_as_a(u[ks], a);
    if constexpr (!cq) {
      static_assert(NJ % 4 == 0, "4 state-row tiles an ldmatrix");
#pragma unroll
      for (int j4 = 0; j4 < NJ / 4; ++j4) {
        uint32_t r[4];
        ldsm4<true>(r, Kc + (8 * ks + (lane & 7)) * SKK + k0 + 8 * (4 * j4 + (lane >> 3)));
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          uint32_t b0, b1;
          split16<QT>(r[m], b0, b1);
          mma8(s[4 * j4 + m], a, b0, b1);
        }
      }
    } else {
      const QT* kp = Kc + (8 * ks + 2 * tq) * SKK + k0 + gq;
#pragma unroll
      for (int j = 0; j < NJ; ++j) {
        uint32_t b0, b1;
        b_frag<SKK, cq>(kp + 8 * j, b0, b1);
        mma8(s[j], a, b0, b1);
      }
    }
  }
}

// The chunk recurrence after prepare with the state in registers: each warp owns 16 value
// columns and holds the transposed state S^T of those columns over all K state rows in mma
// accumulators (element r of s[j]: column gq + 8 (r / 2), state row 8j + 2tq + (r % 2)). An
// accumulator tile is an A fragment as it stands (slot t of a k-step holds k = 2t, slot t + 4
// holds k = 2t + 1), so every product of a chunk takes its left operand from registers and only
// the chunk's inputs come from shared memory; the warps never wait for each other within a
// chunk (one block barrier a chunk, for the stage buffers). Per chunk, transposed:
//   R^T = beta (V - exp(gc) nk (K S))^T     from S^T K^T       (rounded to tf32)
//   o^T = scale (exp(gc) nq (Q S)^T + R^T PT^T)
//   U^T = R^T Tinv^T,  S^T <- exp(gc_last) S^T + (exp(gc_last - gc_j) nk_j U_j)^T K
// the same algebra and roundings as the shared-memory pass (tf32 operands, float32 sums).
// NW warps a block (16 NW value columns), one block of NW warps per (b, hv, column group), and
// with fewer than 8 a warp that issues the copies: with 8, a ninth would put three warps on one
// of the SM's four schedulers and cap registers at 168 (ptxas: spills).
template <int NW>
constexpr bool wpass_producer = NW < 8;
template <int K, typename QT, int NW>
__global__ void __launch_bounds__(32 * NW + (wpass_producer<NW> ? 32 : 0), 1)
mma_wpass(const QT* __restrict__ q, const QT* __restrict__ k, const QT* __restrict__ v,
          const float* __restrict__ tinv, const float* h0, float* state, void* __restrict__ o,
          int T, int H, int HV, int V, float scale, int odt, int NC, const Packed pk) {
  using P = WarpStage<K, QT, NW>;
  constexpr int NTH = 32 * NW, NS = K / 8, SVT = P::SVT;
  WB_DYNAMIC_SMEM(float4, smem4);
  float* sm = reinterpret_cast<float*>(smem4);
  const PassBlock pb = pass_block(pk, HV);
  const SeqAt sq = pass_seq(pk, pb.x, HV, T, NC);
  const int b = sq.b, hv = pb.x % HV, h = hv / (HV / H), tend = sq.first + sq.len;
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, gq = lane >> 2, tq = lane & 3;
  const int wc = 16 * w, c0 = pb.y * P::BV + wc;  // the warp's columns: c0 + 0..15
  const long at = gdn::state_index(sq.sb, hv, HV, K, V) + c0;
  float* st = state + at;
  float s[NS][4];
  // (the copying warp, w = NW, has no columns: past the block's, past h0's end in the last one)
  load_state_rows(s, h0 && w < NW ? h0 + at : nullptr, 0, V, gq, tq);
  wait_for_primary();  // prepare's workspace complete (a dependent launch; else nothing)
  WB_CLK_INIT(2);
  // chunk n's stage, copied by the NT threads of the NW warps (id: tid) or by the producer warp
  // (NT 32, id: lane)
  auto issue = [&](int n, auto nt, int id) {
    const int t0 = sq.first + n * kC;
    issue_warp_stage<K, QT, NW, decltype(nt)::value>(
        sm + (n & 1) * P::floats, q, k, v, tinv + (sq.crow + n) * kChunkWs,
        gdn::qk_index(b, t0, h, T, H, K), gdn::v_index(b, t0, hv, T, HV, V) + pb.y * P::BV, H,
        HV, V, gdn::imin(kC, tend - t0), id);
  };
  using All = std::integral_constant<int, NTH>;
  using Warp = std::integral_constant<int, 32>;
  // a warp past the NW launched (NW < 8; WORKBENCH_GDN_MMA_COPY, default): it issues every copy,
  // after the block barrier a chunk, and waits for them before the next; the NW warps only
  // compute (the same copies and order: the same results)
  const bool prod = wpass_producer<NW> && blockDim.x > NTH;
  if (wpass_producer<NW> && w == NW) {
    if (sq.nc > 0) issue(0, Warp{}, lane);
    for (int n = 0; n < sq.nc; ++n) {
      cp_wait<0>();
      __syncthreads();
      if (n + 1 < sq.nc) issue(n + 1, Warp{}, lane);
    }
    return;
  }
  if (sq.nc > 0 && !prod) issue(0, All{}, tid);
  WB_CLK(0);
  for (int n = 0; n < sq.nc; ++n) {
    const int t0 = sq.first + n * kC, L = gdn::imin(kC, tend - t0);
    cp_wait<0>();
    __syncthreads();  // this chunk's stage is in place; every warp is done with the other one
    WB_CLK(1);
    if (n + 1 < sq.nc && !prod) issue(n + 1, All{}, tid);
    WB_CLK(2);
    const float* sb = sm + (n & 1) * P::floats;
    const QT* Kc = reinterpret_cast<const QT*>(sb + P::Kk);
    const QT* Qc = reinterpret_cast<const QT*>(sb + P::Qq);
    const QT* Vc = reinterpret_cast<const QT*>(sb + P::Vt) + wc;
    const float *Tv = sb + P::Tv, *PTv = sb + P::PTv;
    // the chunk's factors: exp(gc) nk, exp(gc) nq, beta, exp(gc_last - gc) nk, exp(gc_last)
    const float *fek = sb + P::F, *feq = fek + kC, *fbt = feq + kC, *fd = fbt + kC;
    // (K S)^T and (Q S)^T, [16 columns][64 positions], over the state rows; A = S^T (registers)
    float x[8][4], y[8][4];
    zero1(x);
    zero1(y);
    state_times_kq<NS, P::SKK>(s, Kc, Qc, 0, x, y, lane);
    // R^T (rounded) in x, exp(gc) nq (Q S)^T in y
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int i = 8 * nt + 2 * tq + e;
        const float ek = fek[i], eq = feq[i], bi = fbt[i];
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int r = 2 * hf + e;
          x[nt][r] = rtf32(bi * (to_f(Vc[i * SVT + gq + 8 * hf]) - ek * x[nt][r]));
          y[nt][r] = eq * y[nt][r];
        }
      }
    WB_CLK(3);
    // o^T += R^T PT^T, then U^T = R^T Tinv^T; o is written first so that y is free before u is
    // formed
    r_times_lower(x, PTv, y, gq, tq);
    store_o_t(o, odt, gdn::v_index(b, t0 + 2 * tq, hv, T, HV, V) + c0 + gq, (long)HV * V, scale, y,
              L, tq);
    WB_CLK(4);
    float u[8][4];
    zero1(u);
    r_times_lower(x, Tv, u, gq, tq);
    decay_round(u, fd, tq);
    WB_CLK(5);
    // S^T <- exp(gc_last) S^T + Ud^T K: update_state's loops written out here, where the helper
    // made ptxas branch around the o stores instead of predicating them (K = 64: 85-112 more SASS
    // instructions a chunk; benchmarks/gdn_sass_mix.py)
    const float el = fd[kC];
#pragma unroll
    for (int j = 0; j < NS; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) s[j][r] *= el;
#pragma unroll
    for (int ks = 0; ks < 8; ++ks) {
      uint32_t a[4];
      acc_as_a(u[ks], a);
      if constexpr (!is_f32<QT>) {
#pragma unroll
        for (int j4 = 0; j4 < NS / 4; ++j4) {
          uint32_t r[4];
          ldsm4<true>(r, Kc + (8 * ks + (lane & 7)) * P::SKK + 8 * (4 * j4 + (lane >> 3)));
#pragma unroll
          for (int m = 0; m < 4; ++m) {
            uint32_t b0, b1;
            split16<QT>(r[m], b0, b1);
            mma8(s[4 * j4 + m], a, b0, b1);
          }
        }
      } else {
        const QT* kp = Kc + (8 * ks + 2 * tq) * P::SKK + gq;
#pragma unroll
        for (int j = 0; j < NS; ++j) {
          uint32_t b0, b1;
          b_frag<P::SKK, true>(kp + 8 * j, b0, b1);
          mma8(s[j], a, b0, b1);
        }
      }
    }
    WB_CLK(6);
    WB_CLK_COUNT();
  }
  store_state_rows(s, st, 0, V, gq, tq);
}

// -------------------------------------------------------------------- the warp-pair pass

// The warp-resident pass with each 16-column group over a pair of warps (`pair`, forced only
// until it is timed on a GPU): warp 2p + h of the block holds the transposed state S^T of the
// pair's 16 columns over state rows (K / 2) h .. (K / 2) (h + 1) in mma accumulators, so a warp's
// chain of products a chunk is about half the warp-resident pass's (K = 128: 228 mma instead of
// 456) and a grid has twice the warps. Per chunk, transposed as there:
//   both halves: partial (K S)^T and (Q S)^T over their state rows; the halves' partials are
//     summed (rows 0 .. K/2 - 1 first, as the shared-memory pass's two chains), over shared memory;
//   h = 0: R^T = beta (V - exp(gc) nk (K S))^T (rounded), U^T = R^T Tinv^T, the decayed, normed,
//     rounded U^T (the update's A operand) to shared memory;
//   h = 1: o^T = scale (exp(gc) nq (Q S)^T + R^T PT^T), R^T from shared memory;
//   both halves: S^T <- exp(gc_last) S^T + Ud^T K over their state rows.
// The same roundings to tf32 as the other passes; the sums over the state rows are the shared-
// memory pass's two chains (its results to float32 summation order). A pair meets at a named
// barrier three times a chunk; the block at one barrier (the stage buffers). Exchange buffers,
// two a pair of 32 x 32 floats (each lane's 8 n-tiles x 4 accumulators, lane-major): X holds
// the second half's partial K S, then R^T; Y the first half's partial Q S, then Ud^T.
template <int K, typename QT, int NP>
__global__ void __launch_bounds__(64 * NP, 1)
mma_ppass(const QT* __restrict__ q, const QT* __restrict__ k, const QT* __restrict__ v,
          const float* __restrict__ tinv, const float* h0, float* state, void* __restrict__ o,
          int T, int H, int HV, int V, float scale, int odt, int NC, const Packed pk) {
  static_assert(!is_f32<QT>, "16-bit q, k, v (float32 stages do not fit with the exchange)");
  using P = WarpStage<K, QT, NP>;  // the block's 16 NP value columns
  constexpr int NTH = 64 * NP, NH = K / 16, SVT = P::SVT;
  constexpr int kXch = 32 * 32;  // floats of one exchange buffer
  WB_DYNAMIC_SMEM(float4, smem4);
  float* sm = reinterpret_cast<float*>(smem4);
  const PassBlock pb = pass_block(pk, HV);
  const SeqAt sq = pass_seq(pk, pb.x, HV, T, NC);
  const int b = sq.b, hv = pb.x % HV, h = hv / (HV / H), tend = sq.first + sq.len;
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, gq = lane >> 2, tq = lane & 3;
  const int pr = w >> 1, hlf = w & 1;  // the warp's pair and its half of the state rows
  const int wc = 16 * pr, c0 = pb.y * P::BV + wc;  // the pair's columns: c0 + 0..15
  const int k0 = (K / 2) * hlf;  // the warp's first state row
  float* X = sm + 2 * P::floats + pr * 2 * kXch + 4 * lane;  // this lane's slots of X
  float* Y = X + kXch;
  auto put8 = [](float* buf, const float (&a)[8][4]) {
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
      *reinterpret_cast<float4*>(buf + nt * 128) =
          make_float4(a[nt][0], a[nt][1], a[nt][2], a[nt][3]);
  };
  auto get8 = [](const float* buf, float (&a)[8][4]) {
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      const float4 x = *reinterpret_cast<const float4*>(buf + nt * 128);
      a[nt][0] = x.x, a[nt][1] = x.y, a[nt][2] = x.z, a[nt][3] = x.w;
    }
  };
  auto pair_sync = [&]() { named_sync<64>(1 + pr); };
  const long at = gdn::state_index(sq.sb, hv, HV, K, V) + c0;
  float* st = state + at;
  float s[NH][4];
  load_state_rows(s, h0 ? h0 + at : nullptr, k0, V, gq, tq);
  wait_for_primary();  // prepare's workspace complete (a dependent launch; else nothing)
  auto issue = [&](int n) {
    const int t0 = sq.first + n * kC;
    issue_warp_stage<K, QT, NP, NTH>(sm + (n & 1) * P::floats, q, k, v,
                                     tinv + (sq.crow + n) * kChunkWs, gdn::qk_index(b, t0, h, T, H, K),
                                     gdn::v_index(b, t0, hv, T, HV, V) + pb.y * P::BV, H, HV,
                                     V, gdn::imin(kC, tend - t0), tid);
  };
  if (sq.nc > 0) issue(0);
  for (int n = 0; n < sq.nc; ++n) {
    const int t0 = sq.first + n * kC, L = gdn::imin(kC, tend - t0);
    cp_wait<0>();
    __syncthreads();  // this chunk's stage is in place; every warp is done with the other one
    if (n + 1 < sq.nc) issue(n + 1);
    const float* sb = sm + (n & 1) * P::floats;
    const QT* Kc = reinterpret_cast<const QT*>(sb + P::Kk);
    const QT* Qc = reinterpret_cast<const QT*>(sb + P::Qq);
    const QT* Vc = reinterpret_cast<const QT*>(sb + P::Vt) + wc;
    const float *Tv = sb + P::Tv, *PTv = sb + P::PTv;
    const float *fek = sb + P::F, *feq = fek + kC, *fbt = feq + kC, *fd = fbt + kC;
    // partial (K S)^T and (Q S)^T over this warp's state rows; A = S^T (registers)
    float x[8][4], y[8][4];
    zero1(x);
    zero1(y);
    state_times_kq<NH, P::SKK>(s, Kc, Qc, k0, x, y, lane);
    if (hlf) put8(X, x);  // the second half's K S to the first, the first half's Q S to the second
    else put8(Y, y);
    pair_sync();
    if (!hlf) {
      // R^T (rounded) from the halves' sum; to X for the second half
      float xb[8][4];
      get8(X, xb);
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int i = 8 * nt + 2 * tq + e;
          const float ek = fek[i], bi = fbt[i];
#pragma unroll
          for (int hf = 0; hf < 2; ++hf) {
            const int r = 2 * hf + e;
            x[nt][r] = rtf32(bi * (to_f(Vc[i * SVT + gq + 8 * hf]) - ek * (x[nt][r] + xb[nt][r])));
          }
        }
      put8(X, x);
    } else {
      // exp(gc) nq (Q S)^T from the halves' sum
      float ya[8][4];
      get8(Y, ya);
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float eq = feq[8 * nt + 2 * tq + e];
#pragma unroll
          for (int hf = 0; hf < 2; ++hf)
            y[nt][2 * hf + e] = eq * (ya[nt][2 * hf + e] + y[nt][2 * hf + e]);
        }
    }
    pair_sync();  // R^T is in X; the second half is done with Y
    float u[8][4];
    if (hlf) {
      get8(X, x);  // R^T
      r_times_lower(x, PTv, y, gq, tq);
      store_o_t(o, odt, gdn::v_index(b, t0 + 2 * tq, hv, T, HV, V) + c0 + gq, (long)HV * V, scale,
                y, L, tq);
    } else {
      zero1(u);
      r_times_lower(x, Tv, u, gq, tq);
      decay_round(u, fd, tq);
      put8(Y, u);  // the update's A operand, for the second half
    }
    pair_sync();  // Ud^T is in Y
    if (hlf) get8(Y, u);
    update_state<NH, P::SKK>(s, u, fd[kC], Kc, k0, lane);
  }
  store_state_rows(s, st, k0, V, gq, tq);
}

// ----------------------------------------------------------------------------------- launcher

bool gdn_chunked_mma_supported_impl(int K, int V) {
  return (K == 64 || K == 128) && (V == 32 || V == 64 || V == 96 || V == 128);
}

template <typename F>
cudaError_t allow_smem(F* kernel, size_t bytes) {
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
}


int sm_count() {
#ifdef WB_MMA_EMU
  int sms = 0;  // the emulated device's (WB_EMU_SMS), read at each launch
#else
  static int sms = 0;
#endif
  if (!sms) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || sms < 1)
      sms = 132;
  }
  return sms;
}

// Which pass runs, for B HV = BH sequences-heads and V value columns on a GPU of sms SMs: 0 for
// the shared-memory pass, 1 for it at 16 value columns a block (smem16), else the warps a block
// of the warp-resident pass (2, 4 or 8), kPair | warps for the warp-pair pass.
// The warp-resident pass where it has at least 2.5 warps an SM (B HV V / 16 warps in all), the
// shared-memory one below that. A single warp's chain of products per chunk is long (about 8 us
// a chunk on the H200 whether 2 or 8 warps share an SM), so the warp pass needs warps to
// overlap; the shared-memory pass spreads a chunk over 8 warps a block. Measured on the H200
// (benchmarks/results/gdn-pass-ab-h200-2026-12-05.jsonl): B1 T8192 HV32 (1.9 warps an SM) warp
// 1.19 ms against 0.65; B1 T2000 HV48 (2.9 an SM) 0.305 against 0.313; B4 T4096 HV32 (7.8 an
// SM) 0.87 against 1.28.
// Below the threshold, smem16 with 16-bit inputs where the 32-column blocks would leave half the
// SMs or more idle (B HV V / 32 <= SMs / 2): twice the blocks, two an SM. Measured on the H100
// (benchmarks/results/gdn-pass-ab-h100-2026-12-06.json): B1 T4096 HV32 K = V = 64 (64 blocks of
// 32 columns) smem16 0.195 ms against smem 0.226; where the 32-column blocks already fill the
// SMs, smem16 repeats each block's key-side work for half the columns and loses (B1 T8192 HV32
// K = V = 128, 128 blocks: 0.636 against 0.555).
// The warp-resident pass's block: 16 value columns a warp, 2, 4 or 8 warps (V allowing; float32
// q, k, v: 2, for shared memory); the fewest waves of blocks over the SMs, then the fewest warps
// a block (more SMs at work, each warp its own scheduler). The arithmetic of a warp does not
// depend on it.
// WORKBENCH_GDN_MMA_PASS=wgmma the wgmma pass (K = V = 128 with bf16 q, k, v; elsewhere the
// shared-memory pass), in no rule yet.
// WORKBENCH_GDN_MMA_PASS=warp|smem|smem16 forces a pass (tests, benchmarks) and =pair the
// warp-pair pass (16-bit inputs; float32 ones take the warp-resident pass), which is in no rule:
// at best 3% faster than the warp-resident pass (a mixed packed batch), slower on the other
// shapes of the same A/B; anything else: the rule.
// The warps launched with a pass's computing warps to issue its copies (WORKBENCH_GDN_MMA_COPY,
// read at each launch; for A/Bs): "warps" none (the computing warps copy), "producer" one,
// otherwise two (the shared-memory passes; the warp-resident pass takes one with fewer than 8
// warps). The same copies, the same results.
int copy_producers() {
  const char* e = getenv("WORKBENCH_GDN_MMA_COPY");
  if (e && !strcmp(e, "warps")) return 0;
  return e && !strcmp(e, "producer") ? 1 : 2;
}

constexpr int kPair = 64, kWg = 128, kWc = 256;
// The block of the fewest waves over the SMs, then the fewest warps: warps 2, 4, .. wmax a block,
// 16 value columns each warp (pair = false) or each two warps (pair = true).
int fewest_waves(int BH, int V, int sms, int wmax, bool pair) {
  int best = 2;
  long best_waves = -1;
  for (int nw = 2; nw <= wmax; nw *= 2) {
    const int cols = pair ? 8 * nw : 16 * nw;
    if (V % cols) continue;
    const long blocks = (long)BH * (V / cols), waves = (blocks + sms - 1) / sms;
    if (best_waves < 0 || waves < best_waves) best = nw, best_waves = waves;
  }
  return best;
}
// The element kinds of q, k, v the plan tells apart (the passes' instances): bf16, float32, fp16.
enum ElemKind { kBf16 = 0, kF32 = 1, kF16 = 2 };
template <typename QT>
constexpr int elem_kind = is_f32<QT> ? kF32 : std::is_same<QT, __nv_bfloat16>::value ? kBf16 : kF16;

// The pass code (0 smem, 1 smem16, kPair | warps, kWg, kWc, else the warp-resident pass's warps)
// for BH heads of V value columns, K key columns and q, k, v of element kind `kind`, on sms SMs:
// the pass that runs (a forced wgmma pass where it does not apply is the shared-memory pass's 0).
//
// A packed launch (pk) whose grid the rule gives the warp-resident pass takes the width of least
// estimated time: a block's chunk step at N warps alone on an SM costs t_N (2, 4, 8 warps: 7671,
// 7819, 12100 cycles at K = 128, the H100's phase clocks of 2026-12-06), and the pass lasts at
// least its longest sequence's chunks and at least the launch's chunks x HV x (V / 16 N) blocks
// over the SMs, each at t_N: max(maxc, sum HV V / (16 N) / sms) t_N, the least, ties to the wider
// block. At even lengths it gives the rule's width on the benchmark's packed rows (16 x 512 and
// 64 x 256 tokens: 8 warps) and on the plain batches' shapes; where one sequence is much longer
// than the rest, narrower blocks finish it sooner (the mixed packed batch 1000, 3001, 500, 2048,
// 77: 4 warps, not 8, 20% faster on the H200; the blocks of the longest sequences start first,
// pass_block). Plain batches keep the rule's width.
int packed_width(const Packed& pk, int HV, int V, int sms, int wmax, int rule) {
  static const double t[9] = {0, 0, 7671, 0, 7819, 0, 0, 0, 12100};
  long maxc = 0, sumc = 0;
  for (int i = 0; i < pk.n; ++i) {
    const long c = pk.chk[i + 1] - pk.chk[i];
    maxc = c > maxc ? c : maxc;
    sumc += c;
  }
  int best = rule;
  double best_t = -1;
  for (int nw = wmax; nw >= 2; nw /= 2) {
    if (V % (16 * nw)) continue;
    const double work = (double)sumc * HV * (V / (16 * nw)) / sms;
    const double est = (work > maxc ? work : (double)maxc) * t[nw];
    if (best_t < 0 || est < best_t) best = nw, best_t = est;
  }
  return best;
}

int pass_plan(int BH, int K, int V, int kind, int sms, const Packed* pk = nullptr) {
  const char* e = getenv("WORKBENCH_GDN_MMA_PASS");
  auto forced = [&](const char* name) { return e && !strcmp(e, name); };
  const bool f32 = kind == kF32;
  const int warp = fewest_waves(BH, V, sms, f32 ? 2 : 8, false);
  if (forced("smem")) return 0;
  if (forced("smem16")) return 1;
  if (forced("warp")) return warp;
  // warpN: the warp-resident pass at N warps a block (2, 4, 8; A/Bs), where its 16 N columns
  // divide V (float32 inputs: N = 2); else the rule's
  for (int nw = 2; nw <= (f32 ? 2 : 8); nw *= 2) {
    char name[8];
    snprintf(name, sizeof name, "warp%d", nw);
    if (forced(name) && V % (16 * nw) == 0) return nw;
  }
  if (forced("pair")) return f32 ? warp : kPair | fewest_waves(BH, V, sms, 8, true);
  // the wgmma passes take bf16 q, k, v (the wgmma pass K = V = 128); elsewhere the shared-memory pass
  if (forced("wgmma")) return kind == kBf16 && K == 128 && V == 128 ? kWg : 0;
  if (forced("wgcols")) return kind == kBf16 ? kWc : 0;
  if (2L * BH * (V / 16) >= 5L * sms)
    return pk && pk->n > 0 && !f32 ? packed_width(*pk, BH / pk->n, V, sms, 8, warp) : warp;
  return !f32 && 2L * BH * (V / 32) <= sms ? 1 : 0;
}

template <int K, typename QT, int NW>
cudaError_t launch_wpass(const GdnArgs* a, const float* h0, float* state, int seqs, int NC,
                         const Packed& pk, cudaStream_t s, bool pdl) {
  if constexpr (is_f32<QT> && NW > 2) {
    return cudaErrorInvalidValue;
  } else {
    constexpr size_t bytes = 2 * sizeof(float) * WarpStage<K, QT, NW>::floats;
    static_assert(bytes <= 227 * 1024, "the warp-resident pass's shared memory");
    cudaError_t err = allow_smem(mma_wpass<K, QT, NW>, bytes);
    if (err != cudaSuccess) return err;
    const dim3 grid(seqs * a->HV, a->V / (16 * NW));
    return WB_LAUNCH_PDL(grid, 32 * NW + (wpass_producer<NW> && copy_producers() ? 32 : 0), bytes,
                         s, pdl, mma_wpass<K, QT, NW>)(
        static_cast<const QT*>(a->q), static_cast<const QT*>(a->k), static_cast<const QT*>(a->v),
        a->tinv, h0, state, a->o, a->T, a->H, a->HV, a->V, a->scale, a->o_dtype, NC, pk);
  }
}

template <int K, typename QT, int NP>
cudaError_t launch_ppass(const GdnArgs* a, const float* h0, float* state, int seqs, int NC,
                         const Packed& pk, cudaStream_t s, bool pdl) {
  if constexpr (is_f32<QT>) {
    return cudaErrorInvalidValue;
  } else {
    constexpr size_t bytes = sizeof(float) * (2 * WarpStage<K, QT, NP>::floats + NP * 2 * 32 * 32);
    static_assert(bytes <= 227 * 1024, "the warp-pair pass's shared memory");
    cudaError_t err = allow_smem(mma_ppass<K, QT, NP>, bytes);
    if (err != cudaSuccess) return err;
    const dim3 grid(seqs * a->HV, a->V / (16 * NP));
    return WB_LAUNCH_PDL(grid, 64 * NP, bytes, s, pdl, mma_ppass<K, QT, NP>)(
        static_cast<const QT*>(a->q), static_cast<const QT*>(a->k), static_cast<const QT*>(a->v),
        a->tinv, h0, state, a->o, a->T, a->H, a->HV, a->V, a->scale, a->o_dtype, NC, pk);
  }
}

// The wgmma pass's form (WORKBENCH_GDN_MMA_WG, read at each launch; A/Bs; mma_wgpass): 0 "sync",
// 1 "ws" (warp-specialised), 2 "pingpong" (and the warpgroups taking turns); anything else: sync.
int wg_form() {
  const char* e = getenv("WORKBENCH_GDN_MMA_WG");
  return e && !strcmp(e, "ws") ? 1 : e && !strcmp(e, "pingpong") ? 2 : 0;
}

template <typename QT>
cudaError_t launch_wgpass(const GdnArgs* a, const float* h0, float* state, int seqs, int NC,
                          const Packed& pk, cudaStream_t s, bool pdl) {
  constexpr size_t bytes = wgp::bytes + 1024;  // and the 1024-byte alignment of the swizzled tiles
  static_assert(bytes <= 227 * 1024, "the wgmma pass's shared memory");
  const int form = wg_form();
  auto go = [&](auto ws) -> cudaError_t {
    constexpr bool WS = decltype(ws)::value;
    cudaError_t err = allow_smem(mma_wgpass<QT, WS>, bytes);
    if (err != cudaSuccess) return err;
    return WB_LAUNCH_PDL(dim3(seqs * a->HV), WS ? 384 : 256, bytes, s, pdl, mma_wgpass<QT, WS>)(
        static_cast<const QT*>(a->q), static_cast<const QT*>(a->k), static_cast<const QT*>(a->v),
        a->tinv, h0, state, a->o, a->T, a->H, a->HV, a->V, a->scale, a->o_dtype, NC, pk, form == 2 ? 1 : 0);
  };
  return form ? go(std::true_type{}) : go(std::false_type{});
}

// The column wgmma pass: BV = 16 value columns a block where the blocks fit on the SMs in one
// wave, else 32 (V allowing)
template <int K>
cudaError_t launch_wcpass(const GdnArgs* a, const float* h0, float* state, int seqs, int NC,
                          const Packed& pk, cudaStream_t s, bool pdl) {
  auto go = [&](auto bv) -> cudaError_t {
    constexpr int BV = decltype(bv)::value;
    constexpr size_t bytes = wcp::Smem<K, BV>::bytes;
    static_assert(bytes <= 227 * 1024, "the column wgmma pass's shared memory");
    const dim3 grid(seqs * a->HV, a->V / BV);
    auto with = [&](auto prod) -> cudaError_t {
      constexpr bool PROD = decltype(prod)::value;
      cudaError_t err = allow_smem(mma_wcpass<K, BV, PROD>, bytes);
      if (err != cudaSuccess) return err;
      return WB_LAUNCH_PDL(grid, PROD ? 160 : 128, bytes, s, pdl, mma_wcpass<K, BV, PROD>)(
          static_cast<const __nv_bfloat16*>(a->q), static_cast<const __nv_bfloat16*>(a->k),
          static_cast<const __nv_bfloat16*>(a->v), a->tinv, h0, state, a->o, a->T, a->H, a->HV,
          a->V, a->scale, a->o_dtype, NC, pk);
    };
    // a warp of its own issues the copies (WORKBENCH_GDN_MMA_COPY=warps: the warpgroup does)
    return copy_producers() ? with(std::true_type{}) : with(std::false_type{});
  };
  const long blocks16 = (long)seqs * a->HV * (a->V / 16);
  return blocks16 <= sm_count() || a->V % 32 ? go(std::integral_constant<int, 16>{})
                                              : go(std::integral_constant<int, 32>{});
}

template <int K, typename QT, int BV>
cudaError_t launch_pass(const GdnArgs* a, const float* h0, float* state, int seqs, int NC,
                        const Packed& pk, cudaStream_t s, bool pdl) {
  constexpr size_t bytes = sizeof(float) * PassSmem<K, QT, BV>::floats;
  static_assert(bytes <= 227 * 1024, "the shared-memory pass's shared memory");
  // lean staging: two blocks an SM (228 KiB an SM, 1 KiB of it reserved a block)
  static_assert(!pass_lean<K, QT, BV> || 2 * (bytes + 1024) <= 228 * 1024, "two blocks an SM");
  cudaError_t err = allow_smem(mma_pass<K, QT, BV>, bytes);
  if (err != cudaSuccess) return err;
  if constexpr (pass_lean<K, QT, BV>)  // all of the SM's on-chip memory as shared memory: 2 blocks
    err = cudaFuncSetAttribute(mma_pass<K, QT, BV>, cudaFuncAttributePreferredSharedMemoryCarveout,
                               (int)cudaSharedmemCarveoutMaxShared);
  if (err != cudaSuccess) return err;
  const dim3 grid(seqs * a->HV, a->V / BV);
  // pdl: lean blocks would land where prepare's blocks end first, two an SM while other SMs idle
  // (measured with the pass beside prepare's tail, 2026-12-06): where the grid fits on the SMs
  // one a block, it asks for more than half an SM's shared memory (one of prepare's still fits)
  size_t ask = bytes;
  if (pass_lean<K, QT, BV> && pdl && (long)grid.x * grid.y <= sm_count()) {
    ask = bytes > 116 * 1024 ? bytes : 116 * 1024;
    if ((err = allow_smem(mma_pass<K, QT, BV>, ask)) != cudaSuccess) return err;
  }
  return WB_LAUNCH_PDL(grid, kThreads + 32 * copy_producers(), ask, s, pdl, mma_pass<K, QT, BV>)(
      static_cast<const QT*>(a->q), static_cast<const QT*>(a->k), static_cast<const QT*>(a->v),
      a->tinv, h0, state, a->o, a->T, a->H, a->HV, a->V, a->scale, a->o_dtype, NC, pk);
}

// prepare and the pass over seqs sequences of NC chunks at most: a plain batch (pk.n = 0, seqs =
// B) or one launch's group of a packed batch (seqs = pk.n, NC = pk.nc; state: the group's first).
template <int K, typename QT>
cudaError_t launch_chunks(const GdnArgs* a, const float* h0, float* state, int seqs, int NC,
                          const Packed& pk, cudaStream_t s) {
  const QT *q = static_cast<const QT*>(a->q), *k = static_cast<const QT*>(a->k);  // prepare's
  constexpr int kMaxSmem = 227 * 1024;  // an sm_90 block's opt-in shared memory
  static_assert(sizeof(float) * PrepSmem<K, QT>::floats <= kMaxSmem, "prepare's shared memory");
  const int HV = a->HV, V = a->V;
  cudaError_t err;
  const int nw = pass_plan(seqs * HV, K, V, elem_kind<QT>, sm_count(), &pk);
  // the wgmma passes (planned only where they apply: bf16 q, k, v; the wgmma pass K = V = 128)
  // read Tinv and PT as bf16 halves (put_ws)
  constexpr bool wgk = elem_kind<QT> == kBf16;
  const bool wg = wgk && (nw == kWg || nw == kWc);
  // prepare: a block per chunk and key head, for its HV / H value heads (packed: the launch's
  // NC = pk.nc chunks, all sequences)
  // (WORKBENCH_GDN_MMA_PREPARE=value-head: a block per value head, for the A/B)
  const int chunks = pk.n ? NC : seqs * NC;
  const char* pe = getenv("WORKBENCH_GDN_MMA_PREPARE");
  const int hvs = pe && !strcmp(pe, "value-head") ? 1 : HV / a->H;
  // full, doubling (A/Bs), else the default
  const char* se = getenv("WORKBENCH_GDN_MMA_SOLVE");
  const int solve = se && !strcmp(se, "full")       ? kSolveFull
                    : se && !strcmp(se, "doubling") ? kSolveDoubling
                                                    : kSolveShort;
  const char* ge = getenv("WORKBENCH_GDN_MMA_GATES");
  const bool pre_gates = ge && !strcmp(ge, "prefetch");
  // (the prefetched gates' 4 KiB only where they are prefetched)
  const size_t s1 = sizeof(float) * (pre_gates ? PrepSmem<K, QT>::floats : PrepSmem<K, QT>::gb);
  // a launch of only empty sequences has no chunk to prepare; its pass still copies h0 (or zeros)
  // into their final states
  auto prepare = [&](auto halves) {
    constexpr bool HALVES = decltype(halves)::value;
    const cudaError_t e = allow_smem(mma_prepare<K, QT, HALVES>, s1);
    if (e == cudaSuccess && chunks > 0)
      WB_LAUNCH(chunks * (HV / hvs), kThreads, s1, s, mma_prepare<K, QT, HALVES>)(
          q, k, a->g, a->beta, a->nq, a->nk, a->tinv, a->T, a->H, HV, NC, hvs, solve, pre_gates,
          pk);
    return e;
  };
  if ((err = wg ? prepare(std::bool_constant<wgk>{}) : prepare(std::false_type{})) != cudaSuccess) return err;
  // the pass launched to start beside prepare's last blocks (it waits for prepare's end before it
  // copies the workspace; after a launch of only empty sequences, which has no prepare, an
  // ordinary launch); WORKBENCH_GDN_MMA_PDL=off: an ordinary launch (A/Bs)
  const char* pd = getenv("WORKBENCH_GDN_MMA_PDL");
  const bool pdl = chunks > 0 && !(pd && !strcmp(pd, "off"));
  if constexpr (wgk) {
    if constexpr (K == 128)
      if (nw == kWg) return launch_wgpass<QT>(a, h0, state, seqs, NC, pk, s, pdl);
    if (nw == kWc) return launch_wcpass<K>(a, h0, state, seqs, NC, pk, s, pdl);
  }
  if (nw == 0) return launch_pass<K, QT, 32>(a, h0, state, seqs, NC, pk, s, pdl);
  if (nw == 1) return launch_pass<K, QT, 16>(a, h0, state, seqs, NC, pk, s, pdl);
  if (nw & kPair)
    return nw == (kPair | 8)   ? launch_ppass<K, QT, 4>(a, h0, state, seqs, NC, pk, s, pdl)
           : nw == (kPair | 4) ? launch_ppass<K, QT, 2>(a, h0, state, seqs, NC, pk, s, pdl)
                               : launch_ppass<K, QT, 1>(a, h0, state, seqs, NC, pk, s, pdl);
  return nw == 8   ? launch_wpass<K, QT, 8>(a, h0, state, seqs, NC, pk, s, pdl)
         : nw == 4 ? launch_wpass<K, QT, 4>(a, h0, state, seqs, NC, pk, s, pdl)
                   : launch_wpass<K, QT, 2>(a, h0, state, seqs, NC, pk, s, pdl);
}

// The table of a packed launch: sequences g0 .. g0 + kSeqs - 1 (at most) of the nseq at token
// offsets cu[0..nseq]; chunk offsets from 0 (ceil(length / 64) chunks a sequence).
void packed_group(const int* cu, int nseq, int g0, Packed& pk) {
  pk.n = nseq - g0 < kSeqs ? nseq - g0 : kSeqs;
  pk.tok[0] = cu[g0];
  pk.chk[0] = 0;
  for (int i = 0; i < pk.n; ++i) {
    pk.tok[i + 1] = cu[g0 + i + 1];
    pk.chk[i + 1] = pk.chk[i] + (pk.tok[i + 1] - pk.tok[i] + kC - 1) / kC;
  }
  pk.nc = pk.chk[pk.n];
  // the pass's blocks by decreasing chunks (a stable insertion sort; WORKBENCH_GDN_MMA_ORDER=given:
  // as launched, for the A/B)
  const char* e = getenv("WORKBENCH_GDN_MMA_ORDER");
  pk.order = !(e && !strcmp(e, "given"));
  for (int i = 0; i < pk.n; ++i) {
    const int c = pk.chk[i + 1] - pk.chk[i];
    int j = i;
    for (; j > 0 && pk.chk[pk.ord[j - 1] + 1] - pk.chk[pk.ord[j - 1]] < c; --j) pk.ord[j] = pk.ord[j - 1];
    pk.ord[j] = i;
  }
}

// A batch of B sequences (cu null) or a packed batch of nseq sequences at token offsets cu[0..nseq]
// (B = 1; a->state holds nseq states), one launch pair per kSeqs sequences.
template <int K, typename QT>
int launch_mma(const GdnArgs* a, const int* cu, int nseq) {
  auto s = static_cast<cudaStream_t>(a->stream);
  if (a->nq) {  // the L2 norms of q and k, applied by the kernels
    const long rows = (long)a->B * a->T * a->H;
    const unsigned blocks = (unsigned)((rows + kThreads / 32 - 1) / (kThreads / 32));
    WB_LAUNCH(blocks, kThreads, 0, s, mma_l2_norms<QT>)(
        static_cast<const QT*>(a->q), static_cast<const QT*>(a->k), a->nq, a->nk, rows, K);
  }
  Packed pk;
  pk.n = pk.nc = pk.order = 0;
  cudaError_t err = cudaSuccess;
  // the initial states: h0, or (h0 null) state itself, read in place, or zeros (zero_state); the
  // passes read them and write the final states to state
  const float* h0 = a->zero_state ? nullptr : a->h0 ? a->h0 : a->state;
  if (!cu) {
    err = launch_chunks<K, QT>(a, h0, a->state, a->B, (a->T + kC - 1) / kC, pk, s);
  } else {
    for (int g0 = 0; g0 < nseq && err == cudaSuccess; g0 += kSeqs) {
      packed_group(cu, nseq, g0, pk);
      const long at = (long)g0 * a->HV * a->K * a->V;
      err = launch_chunks<K, QT>(a, h0 ? h0 + at : nullptr, a->state + at, pk.n, pk.nc, pk, s);
    }
  }
  if (err != cudaSuccess) return (int)err;
  return (int)cudaGetLastError();
}

template <typename QT>
int launch_mma_k(const GdnArgs* a, const int* cu, int nseq) {
  return a->K == 128 ? launch_mma<128, QT>(a, cu, nseq) : launch_mma<64, QT>(a, cu, nseq);
}

// Checks shared by both entry points: WB_OK or the status to return.
int mma_args_status(const GdnArgs* a) {
  if (!gdn_chunked_mma_supported_impl(a->K, a->V) || a->chunk != 64) return WB_ERR_SHAPE;
  if (a->o_dtype < 0 || a->o_dtype > 2 || !a->nq != !a->nk) return WB_ERR_ARGUMENT;
  if (a->in_dtype != WB_FP32 && a->in_dtype != WB_BF16 && a->in_dtype != WB_FP16)
    return WB_ERR_ARGUMENT;
  return WB_OK;
}

int launch_mma_dtype(const GdnArgs* a, const int* cu, int nseq) {
  const int st = mma_args_status(a);
  if (st != WB_OK) return st;
  switch (a->in_dtype) {
    case WB_FP32: return launch_mma_k<float>(a, cu, nseq);
    case WB_BF16: return launch_mma_k<__nv_bfloat16>(a, cu, nseq);
    default: return launch_mma_k<__half>(a, cu, nseq);
  }
}

}  // namespace

extern "C" {

// Whether the tensor-core chunked path takes this shape (chunk 64): 1 or 0.
int gdn_chunked_mma_supported(int K, int V) { return gdn_chunked_mma_supported_impl(K, V) ? 1 : 0; }

// The pass the mma path takes for B * HV = BH heads of K key and V value columns, q, k, v of
// element kind `kind` (0 bf16, 1 float32, 2 fp16) on a GPU of sms SMs: 0 for the shared-memory
// pass, 1 for its 16-column blocks (smem16), 64 (kPair) | the warps a block of the warp-pair pass
// (2, 4 or 8; forced only), 128 (kWg) the wgmma pass and 256 (kWc) the column wgmma pass (forced
// only, where they apply), else the warp-resident pass's warps a block (2, 4 or 8); honours
// WORKBENCH_GDN_MMA_PASS as the launcher does. Host code only: callable without a GPU. A packed
// batch's launch has BH = HV times its sequences (up to 128 a launch, empty ones included).
int gdn_mma_pass_plan(int BH, int K, int V, int kind, int sms) {
  return pass_plan(BH, K, V, kind, sms > 0 ? sms : 1);
}

// The pass code of a packed batch's launch starting at sequence g0 (host code; for the kernel log
// and tests): HV heads, K, V, element kind, sms SMs.
int gdn_mma_packed_pass_plan(const int* cu, int n, int g0, int HV, int K, int V, int kind, int sms) {
  Packed pk;
  packed_group(cu, n, g0, pk);
  return pass_plan(pk.n * HV, K, V, kind, sms > 0 ? sms : 1, &pk);
}

// The floats of one chunk's workspace on the mma path (GdnArgs.tinv holds one per chunk and head).
int gdn_mma_chunk_workspace(void) { return kChunkWs; }

#if defined(WB_GDN_CLOCKS) && !defined(WB_MMA_EMU)
// The phase clocks of the diagnostic build ([3][8][16] counters: prepare, the shared-memory pass,
// the warp-resident pass; warps; phases, 15: iterations) into out (384 values), then zeroed.
int gdn_mma_clocks(unsigned long long* out) {
  cudaError_t e = cudaDeviceSynchronize();
  if (e == cudaSuccess) e = cudaMemcpyFromSymbol(out, wb_clk, sizeof(wb_clk));
  static const unsigned long long zero[3 * 8 * 16] = {};
  if (e == cudaSuccess) e = cudaMemcpyToSymbol(wb_clk, zero, sizeof(wb_clk));
  return (int)e;
}
#endif

// Tensor-core chunked prefill (chunk 64, fp32 accumulators, tf32 operands). q, k, v: float32
// (in_dtype 0), bf16 (1) or fp16 (2), all three alike; g, beta float32. Workspace: tinv, each
// chunk's (I + A)^-1, P (I + A)^-1 and factor rows [B,HV,NC,gdn_mma_chunk_workspace()] (NC =
// ceil(T / 64)), float32, provided by the caller (gcum, W and U are not used); nq, nk
// [B,T,H] float32 for the L2 norm of q and k (qk_l2norm; computed here), or both null for none.
// o_dtype: 0 float32, 1 bf16, 2 fp16 (o's element type); GdnArgs.chunk is 64. Returns WB_OK, a
// cudaError_t code, WB_ERR_SHAPE for a shape gdn_chunked_mma_supported refuses, or
// WB_ERR_ARGUMENT for an unknown dtype code or one norm array alone.
int gdn_chunked_mma_cuda(const GdnArgs* a) { return launch_mma_dtype(a, nullptr, 0); }

// The same over a packed batch (varlen): B = 1, n sequences at token offsets cu[0..n] (host
// memory: cu[0] = 0, non-decreasing, cu[n] = T), each chunked from its own first token, state
// [n,HV,K,V] (in/out; an empty sequence's is left as it is), tinv
// [HV,NCS,gdn_mma_chunk_workspace()] with NCS the most chunks of one launch (a sequence:
// ceil(length / 64); launches reuse it). Each sequence's arithmetic is the one of a batch of that
// sequence alone, on the pass the launch takes (gdn_mma_pass_plan with BH = HV times the
// launch's sequences). One launch of prepare and the pass per 128 sequences. Returns
// as gdn_chunked_mma_cuda, and WB_ERR_ARGUMENT for B != 1 or offsets out of order.
int gdn_chunked_mma_varlen_cuda(const GdnArgs* a, const int* cu, int n) {
  if (a->B != 1 || !cu || n < 1 || cu[0] != 0 || cu[n] != a->T) return WB_ERR_ARGUMENT;
  for (int i = 0; i < n; ++i)
    if (cu[i + 1] < cu[i]) return WB_ERR_ARGUMENT;
  return launch_mma_dtype(a, cu, n);
}

// The table of a packed batch's launch starting at sequence g0 (host code, for tests): fills
// tok and chk (kSeqs + 1 ints each room) and *nc, returns the launch's sequence count.
int gdn_mma_packed_group(const int* cu, int n, int g0, int* tok, int* chk, int* nc) {
  Packed pk;
  packed_group(cu, n, g0, pk);
  for (int i = 0; i <= pk.n; ++i) tok[i] = pk.tok[i], chk[i] = pk.chk[i];
  *nc = pk.nc;
  return pk.n;
}

}  // extern "C"
