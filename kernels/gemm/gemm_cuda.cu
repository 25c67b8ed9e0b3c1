// CUDA build of split-K GEMM for skinny x (M <= 16 rows per launch, e.g. lm_head decode).
// Two kernels compute the per-slice partials; a third reduces the S partials per element.
//
// splitk_mma_kernel (bf16/fp16 inputs, the default for them): tensor cores, mma.sync m16n8k16
// with fp32 results, "swap AB": the weight is the 16-row A operand (16 output columns n) and x^T
// the 8-column B operand (8 tokens; M padded with zeros to 8 or 16). A block of 4 warps owns 32
// columns and one K slice; the slice is walked in chunks of 32 k, two chunks per warp and
// iteration (every lane has eight 16-byte loads of w in flight, streamed past L1). Each thread
// loads 8 consecutive k of a row; the k order inside a chunk is permuted identically for A and B,
// which leaves every dot product unchanged. Every mma sums 16 exact products (bf16 x bf16 and
// fp16 x fp16 products are exact in fp32) starting from a zero accumulator, in the tensor core's
// own order and rounding; its result is added to a per-warp fp32 accumulator (round to nearest),
// and the 4 warps' accumulators are added in warp order through shared memory. So inside a slice
// the order of accumulation differs from the CPU build's k = k0, k0+1, ... loop; the slice's sum
// is then rounded to the partial dtype and the partials reduced exactly as below.
//
// splitk_partials_kernel (fp32 inputs, and any dtype on request): CUDA cores, one warp per output
// column n and K slice; lanes stride the slice 8 elements at a time (16-byte loads of w, four in
// flight per lane), keep M fp32 accumulators, and combine them with a fixed butterfly; lane 0
// rounds the partial to the partial dtype.
//
// With S == 1 the (rounded) partial is the output and is written to y directly.
#include <cuda_runtime.h>
#include <stdint.h>
#include "common/mma_ops.h"
#include "gemm/gemm_abi.h"
#include "gemm/gemm_elem.h"

#define GEMM_MAXM 16
#define GEMM_WARPS 8
#define GEMM_U 4

template <int MM>
__global__ void __launch_bounds__(32 * GEMM_WARPS) splitk_partials_kernel(const void* __restrict__ x, const void* __restrict__ w, int M, int N, int K,
                                       int S, int dt, int part_dt, float* __restrict__ parts) {
  const int lane = threadIdx.x & 31;
  const int n = blockIdx.x * GEMM_WARPS + (threadIdx.x >> 5);
  const int s = blockIdx.y;
  if (n >= N) return;
  const int c = wb_slice_len(K, S);
  const int k0 = s * c, k1 = min(K, k0 + c);
  float acc[MM];
#pragma unroll
  for (int m = 0; m < MM; ++m) acc[m] = 0.0f;
  const bool vec = dt == WB_BF16 && (K % 8) == 0 && (k0 % 8) == 0 && (k1 % 8) == 0;
  if (vec) {
    // GEMM_U independent 16-byte loads in flight per lane before they are used
    const uint4* wr = (const uint4*)((const uint16_t*)w + (int64_t)n * K);
    const int c1 = k1 / 8;
    for (int kb = k0 / 8 + lane; kb < c1; kb += 32 * GEMM_U) {
      uint4 wu[GEMM_U];
#pragma unroll
      for (int j = 0; j < GEMM_U; ++j) wu[j] = kb + 32 * j < c1 ? __ldg(wr + kb + 32 * j) : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int j = 0; j < GEMM_U; ++j) {
        const int kc = kb + 32 * j;
        if (kc >= c1) break;
        const uint32_t wd[4] = {wu[j].x, wu[j].y, wu[j].z, wu[j].w};
        float wf[8];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          wf[2 * i] = __uint_as_float(wd[i] << 16);
          wf[2 * i + 1] = __uint_as_float(wd[i] & 0xffff0000u);
        }
#pragma unroll
        for (int m = 0; m < MM; ++m)
          if (m < M) {
            const uint4 xu = __ldg((const uint4*)((const uint16_t*)x + (int64_t)m * K) + kc);
            const uint32_t xd[4] = {xu.x, xu.y, xu.z, xu.w};
            float a = acc[m];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              a = a + __uint_as_float(xd[i] << 16) * wf[2 * i];
              a = a + __uint_as_float(xd[i] & 0xffff0000u) * wf[2 * i + 1];
            }
            acc[m] = a;
          }
      }
    }
  } else {
    for (int k = k0 + lane; k < k1; k += 32) {
      const float wv = wb_load(w, (int64_t)n * K + k, dt);
#pragma unroll
      for (int m = 0; m < MM; ++m)
        if (m < M) acc[m] = acc[m] + wb_load(x, (int64_t)m * K + k, dt) * wv;
    }
  }
#pragma unroll
  for (int m = 0; m < MM; ++m) {
    if (m >= M) break;
    float a = acc[m];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) a = a + __shfl_xor_sync(0xffffffffu, a, off);
    if (lane == 0) parts[((int64_t)s * M + m) * N + n] = wb_round_to(a, part_dt);
  }
}

// ---- tensor-core path -------------------------------------------------------------------------
#define TC_WARPS 4
#define TC_COLS 32  // two m16 tiles of output columns per block
#define TC_U 2      // chunks of 32 k per warp and iteration

// 16 bytes of w, read-only, not kept in L1 (the weight is streamed once; x stays in L1)
__device__ __forceinline__ uint4 tc_ld_stream(const void* p) {
  uint4 r;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}

// 8 consecutive 16-bit elements row[k .. k+8): MASK: zeros at and past k1 (VEC: k and k1 are
// multiples of 8, so a group is wholly in or out)
template <bool VEC, bool MASK, bool STREAM>
__device__ __forceinline__ uint4 tc_ld8(const uint16_t* row, int k, int k1) {
  if constexpr (VEC) {
    if (MASK && k >= k1) return make_uint4(0, 0, 0, 0);
    if constexpr (STREAM) return tc_ld_stream(row + k);
    else return __ldg((const uint4*)(row + k));
  } else {
    uint32_t v[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t lo = !MASK || k + 2 * i < k1 ? row[k + 2 * i] : 0u;
      const uint32_t hi = !MASK || k + 2 * i + 1 < k1 ? row[k + 2 * i + 1] : 0u;
      v[i] = lo | (hi << 16);
    }
    return make_uint4(v[0], v[1], v[2], v[3]);
  }
}

// d = A (16x16, row) * B (16x8, col) + 0, fp32 results
template <int DT>
__device__ __forceinline__ void tc_mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                       uint32_t a3, uint32_t b0, uint32_t b1) {
  const uint32_t a[4] = {a0, a1, a2, a3};
  d[0] = d[1] = d[2] = d[3] = 0.0f;
  if (DT == WB_BF16)
    wbmma::bf16_m16n8k16(d, a, b0, b1);
  else
    wbmma::f16_m16n8k16(d, a, b0, b1);
}

// one iteration of a warp: TC_U chunks of 32 k from kb; every thread loads 8 consecutive k
// (kb + 32 u + 8 t ..) of its 4 w rows and MT x rows, then runs 2 * 2 * MT mmas per chunk
template <int DT, int MT, bool VEC, bool MASK>
__device__ __forceinline__ void tc_step(const uint16_t* const (&wr)[4], const uint16_t* const (&xr)[MT], int kb,
                                        int t, int k1, float (&acc)[2][MT][4]) {
  uint4 wv[TC_U][4], xv[TC_U][MT];
#pragma unroll
  for (int u = 0; u < TC_U; ++u) {
    const int k = kb + 32 * u + 8 * t;
#pragma unroll
    for (int r = 0; r < 4; ++r) wv[u][r] = tc_ld8<VEC, MASK, true>(wr[r], k, k1);
#pragma unroll
    for (int j = 0; j < MT; ++j) xv[u][j] = tc_ld8<VEC, MASK, false>(xr[j], k, k1);
  }
#pragma unroll
  for (int u = 0; u < TC_U; ++u)
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < MT; ++j) {
        // the thread's 8 k (k + 0..7) feed two mmas: logical k 2t+e <-> k+e (resp. k+4+e) and
        // logical k 2t+8+e <-> k+2+e (resp. k+6+e), the same permutation for A and B
        const uint4 lo = wv[u][2 * i], hi = wv[u][2 * i + 1], b = xv[u][j];
        float d[4];
        tc_mma<DT>(d, lo.x, hi.x, lo.y, hi.y, b.x, b.y);
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][j][e] = acc[i][j][e] + d[e];
        tc_mma<DT>(d, lo.z, hi.z, lo.w, hi.w, b.z, b.w);
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][j][e] = acc[i][j][e] + d[e];
      }
}

// DT: WB_BF16 or WB_FP16; MT: 8-token tiles (1: M <= 8, 2: M <= 16); VEC: K and the slice length
// are multiples of 8 (16-byte loads; otherwise element loads with the same layout).
template <int DT, int MT, bool VEC>
__global__ void __launch_bounds__(32 * TC_WARPS) splitk_mma_kernel(const uint16_t* __restrict__ x,
                                                                  const uint16_t* __restrict__ w, int M, int N,
                                                                  int K, int S, int part_dt,
                                                                  float* __restrict__ parts) {
  __shared__ float red[TC_WARPS - 1][2 * MT * 4][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;  // mma group id (row / column index) and thread in group
  const int n0 = blockIdx.x * TC_COLS;
  const int s = blockIdx.y;
  const int c = wb_slice_len(K, S);
  const int k0 = s * c, k1 = min(K, k0 + c);
  // this thread's rows: w rows n0 + 16 i + g (+ 8) are A rows g (+ 8) of column tile i; x row
  // 8 j + g is B column g of token tile j. A row of A only reaches the same row of D and a column
  // of B the same column of D, so rows past N or M are clamped to the last one (any finite data)
  // and their outputs are not stored.
  const uint16_t* wr[4];
#pragma unroll
  for (int r = 0; r < 4; ++r) wr[r] = w + (int64_t)min(n0 + 16 * (r >> 1) + g + 8 * (r & 1), N - 1) * K;
  const uint16_t* xr[MT];
#pragma unroll
  for (int j = 0; j < MT; ++j) xr[j] = x + (int64_t)min(8 * j + g, M - 1) * K;
  float acc[2][MT][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < MT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
  // iteration: the block covers TC_WARPS * TC_U consecutive chunks; warp `warp` takes TC_U
  // consecutive ones (a contiguous 64 k = 128 bytes of each of its 32 rows). Whole iterations
  // load unmasked; the last, partial one masks k >= k1 to zeros.
  int kb = k0 + warp * (32 * TC_U);
  for (; kb + 32 * TC_U <= k1; kb += TC_WARPS * 32 * TC_U) tc_step<DT, MT, VEC, false>(wr, xr, kb, t, k1, acc);
  if (kb < k1) tc_step<DT, MT, VEC, true>(wr, xr, kb, t, k1, acc);
  // the warps' accumulators added in warp order 0, 1, 2, 3
  if (warp > 0) {
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < MT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) red[warp - 1][(i * MT + j) * 4 + e][lane] = acc[i][j][e];
  }
  __syncthreads();
  if (warp > 0) return;
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < MT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float a = acc[i][j][e];
#pragma unroll
        for (int v = 0; v < TC_WARPS - 1; ++v) a = a + red[v][(i * MT + j) * 4 + e][lane];
        // D element e: row g (+8 for e >= 2) = column n, column 2t + (e & 1) = token m
        const int n = n0 + 16 * i + g + 8 * (e >> 1);
        const int m = 8 * j + 2 * t + (e & 1);
        if (n < N && m < M) parts[((int64_t)s * M + m) * N + n] = wb_round_to(a, part_dt);
      }
}

__global__ void splitk_reduce_kernel(const float* __restrict__ parts, int MN, int S, int order, float* __restrict__ y) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < MN) y[i] = wb_reduce_partials(parts + i, S, MN, order);
}

// SplitkArgs.path: 0 auto (tensor cores for bf16/fp16 inputs, CUDA cores for fp32), 1 CUDA cores,
// 2 tensor cores (bf16/fp16 only). Returns WB_OK, a cudaError_t code, WB_ERR_SHAPE (M > 16 or
// S > 64) or WB_ERR_PATH (path 2 on fp32).
extern "C" int splitk_matmul_cuda(const SplitkArgs* a) {
  const void *x = a->x, *w = a->w;
  const int M = a->M, N = a->N, K = a->K, S = a->S, dt = a->dt, part_dt = a->part_dt, order = a->order;
  const int path = a->path;
  float *parts = a->parts, *y = a->y;
  if (M > GEMM_MAXM || S > 64 || S < 1) return WB_ERR_SHAPE;
  if (path == 2 && dt == WB_FP32) return WB_ERR_PATH;
  cudaStream_t st = (cudaStream_t)a->stream;
  float* out = S == 1 ? y : parts;  // one slice: the rounded partial is the result
  if (dt != WB_FP32 && path != 1) {
    const bool vec = K % 8 == 0 && wb_slice_len(K, S) % 8 == 0;
    dim3 grid((N + TC_COLS - 1) / TC_COLS, S);
    const uint16_t *xh = (const uint16_t*)x, *wh = (const uint16_t*)w;
#define TC_LAUNCH(DT_, MT_, V_) \
  splitk_mma_kernel<DT_, MT_, V_><<<grid, 32 * TC_WARPS, 0, st>>>(xh, wh, M, N, K, S, part_dt, out)
#define TC_LAUNCH_V(DT_, MT_) \
  if (vec) TC_LAUNCH(DT_, MT_, true); else TC_LAUNCH(DT_, MT_, false)
    if (dt == WB_BF16) {
      if (M <= 8) { TC_LAUNCH_V(WB_BF16, 1); } else { TC_LAUNCH_V(WB_BF16, 2); }
    } else {
      if (M <= 8) { TC_LAUNCH_V(WB_FP16, 1); } else { TC_LAUNCH_V(WB_FP16, 2); }
    }
#undef TC_LAUNCH_V
#undef TC_LAUNCH
  } else {
    dim3 grid((N + GEMM_WARPS - 1) / GEMM_WARPS, S);
    // accumulators sized to the smallest of 1, 2, 4, 8, 16 that holds M: fewer registers, more warps
#define GEMM_LAUNCH(MM_) splitk_partials_kernel<MM_><<<grid, 32 * GEMM_WARPS, 0, st>>>(x, w, M, N, K, S, dt, part_dt, out)
    if (M <= 1) GEMM_LAUNCH(1);
    else if (M <= 2) GEMM_LAUNCH(2);
    else if (M <= 4) GEMM_LAUNCH(4);
    else if (M <= 8) GEMM_LAUNCH(8);
    else GEMM_LAUNCH(16);
#undef GEMM_LAUNCH
  }
  if (S > 1) {
    const int MN = M * N;
    splitk_reduce_kernel<<<(MN + 255) / 256, 256, 0, st>>>(parts, MN, S, order, y);
  }
  return (int)cudaGetLastError();
}

SPLITK_ARGS_LAYOUT
WB_DEFINE_STATUS_NAME
