// CUDA build of split-K GEMM for skinny x (M <= 16 rows per launch, e.g. lm_head decode).
// kernel: one warp per output column n and K slice; lanes stride the slice 8 elements at a time
// (16-byte loads of w, four in flight per lane), keep M fp32 accumulators, and combine them with a fixed butterfly; lane 0
// rounds the partial to the partial dtype. A second kernel reduces the S partials per element.
#include <cuda_runtime.h>
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

__global__ void splitk_reduce_kernel(const float* __restrict__ parts, int MN, int S, int order, float* __restrict__ y) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < MN) y[i] = wb_reduce_partials(parts + i, S, MN, order);
}

extern "C" int splitk_matmul_cuda(const void* x, const void* w, int M, int N, int K, int S, int dt, int part_dt,
                                  int order, float* parts, float* y, void* stream) {
  if (M > GEMM_MAXM || S > 64) return 2;
  cudaStream_t st = (cudaStream_t)stream;
  dim3 grid((N + GEMM_WARPS - 1) / GEMM_WARPS, S);
  // accumulators sized to the smallest of 1, 2, 4, 8, 16 that holds M: fewer registers, more warps
#define GEMM_LAUNCH(MM_) splitk_partials_kernel<MM_><<<grid, 32 * GEMM_WARPS, 0, st>>>(x, w, M, N, K, S, dt, part_dt, parts)
  if (M <= 1) GEMM_LAUNCH(1);
  else if (M <= 2) GEMM_LAUNCH(2);
  else if (M <= 4) GEMM_LAUNCH(4);
  else if (M <= 8) GEMM_LAUNCH(8);
  else GEMM_LAUNCH(16);
#undef GEMM_LAUNCH
  const int MN = M * N;
  splitk_reduce_kernel<<<(MN + 255) / 256, 256, 0, st>>>(parts, MN, S, order, y);
  return (int)cudaGetLastError();
}
