// CUDA build of split-K GEMM for skinny x (M <= 16 rows per launch, e.g. lm_head decode).
// kernel: one warp per output column n and K slice; lanes stride the slice 8 elements at a time
// (16-byte loads of w), keep M fp32 accumulators, and combine them with a fixed butterfly; lane 0
// rounds the partial to the partial dtype. A second kernel reduces the S partials per element.
#include <cuda_runtime.h>
#include "gemm/gemm_elem.h"

#define GEMM_MAXM 16
#define GEMM_WARPS 8

__global__ void splitk_partials_kernel(const void* __restrict__ x, const void* __restrict__ w, int M, int N, int K,
                                       int S, int dt, int part_dt, float* __restrict__ parts) {
  const int lane = threadIdx.x & 31;
  const int n = blockIdx.x * GEMM_WARPS + (threadIdx.x >> 5);
  const int s = blockIdx.y;
  if (n >= N) return;
  const int c = wb_slice_len(K, S);
  const int k0 = s * c, k1 = min(K, k0 + c);
  float acc[GEMM_MAXM];
#pragma unroll
  for (int m = 0; m < GEMM_MAXM; ++m) acc[m] = 0.0f;
  const bool vec = dt == WB_BF16 && (K % 8) == 0 && (k0 % 8) == 0 && (k1 % 8) == 0;
  if (vec) {
    const uint4* wr = (const uint4*)((const uint16_t*)w + (int64_t)n * K);
    for (int kc = k0 / 8 + lane; kc < k1 / 8; kc += 32) {
      const uint4 u = __ldg(wr + kc);
      const uint32_t wd[4] = {u.x, u.y, u.z, u.w};
      float wf[8];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        wf[2 * j] = __uint_as_float(wd[j] << 16);
        wf[2 * j + 1] = __uint_as_float(wd[j] & 0xffff0000u);
      }
#pragma unroll
      for (int m = 0; m < GEMM_MAXM; ++m)
        if (m < M) {
          const uint4 xu = __ldg((const uint4*)((const uint16_t*)x + (int64_t)m * K) + kc);
          const uint32_t xd[4] = {xu.x, xu.y, xu.z, xu.w};
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            acc[m] = acc[m] + __uint_as_float(xd[j] << 16) * wf[2 * j];
            acc[m] = acc[m] + __uint_as_float(xd[j] & 0xffff0000u) * wf[2 * j + 1];
          }
        }
    }
  } else {
    for (int k = k0 + lane; k < k1; k += 32) {
      const float wv = wb_load(w, (int64_t)n * K + k, dt);
#pragma unroll
      for (int m = 0; m < GEMM_MAXM; ++m)
        if (m < M) acc[m] = acc[m] + wb_load(x, (int64_t)m * K + k, dt) * wv;
    }
  }
#pragma unroll
  for (int m = 0; m < GEMM_MAXM; ++m) {
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
  splitk_partials_kernel<<<grid, 32 * GEMM_WARPS, 0, st>>>(x, w, M, N, K, S, dt, part_dt, parts);
  const int MN = M * N;
  splitk_reduce_kernel<<<(MN + 255) / 256, 256, 0, st>>>(parts, MN, S, order, y);
  return (int)cudaGetLastError();
}
