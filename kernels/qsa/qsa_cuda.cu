// CUDA build of the QSA split-KV decode.
// kernel: one block per (b, kv head, split) serves the G = HQ / HKV query heads of that KV head, so
// each K/V row is read once per group; scores are (head, token) work items, P.V is one thread
// per head-dim column holding G accumulators. Sums are sequential in token order (max is exact),
// so the result does not depend on the thread count.
#include <cuda_runtime.h>
#include "qsa/qsa_elem.h"

#define QSA_MAXG 16

__global__ void qsa_split_kernel(const void* __restrict__ q, const void* __restrict__ k, const void* __restrict__ v,
                                 const int32_t* __restrict__ idx, const int32_t* __restrict__ bt, int mode, int HQ,
                                 int HKV, int D, int ps, int max_pages, int L, int S, int P, float qscale, int dt,
                                 int prob_dt, float* __restrict__ o_parts, float* __restrict__ lse_parts) {
  extern __shared__ float sm[];
  const int G = HQ / HKV;
  const int b = blockIdx.x / HKV, hk = blockIdx.x % HKV, s = blockIdx.y;
  float* qs = sm;                 // [G][D]
  float* sc = qs + G * D;         // [G][P] scores, then rounded probabilities
  float* red = sc + G * P;        // [G] max, [G] sum
  long long* slot = (long long*)(sm + ((G * D + G * P + 2 * QSA_MAXG + 2 + 1) & ~1));  // [P], 8-byte aligned
  for (int i = threadIdx.x; i < G * D; i += blockDim.x)
    qs[i] = wb_load(q, ((int64_t)b * HQ + hk * G + i / D) * D + i % D, dt);
  for (int t = threadIdx.x; t < P; t += blockDim.x) {
    int tt = s * P + t;
    slot[t] = tt < L ? wb_slot(idx, bt, mode, b, tt, L, max_pages, ps) : -1;
  }
  __syncthreads();
  for (int w = threadIdx.x; w < G * P; w += blockDim.x) {
    const int g = w % G, t = w / G;
    float acc = -INFINITY;
    if (slot[t] >= 0) {
      acc = 0.0f;
      const int64_t base = (slot[t] * HKV + hk) * D;
      const float* qg = qs + g * D;
      if (dt == WB_BF16 && (D % 8) == 0) {
        const uint4* kr = (const uint4*)((const uint16_t*)k + base);
        for (int c = 0; c < D / 8; ++c) {
          uint4 u = __ldg(kr + c);
          uint32_t wds[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            acc = acc + qg[8 * c + 2 * j] * __uint_as_float(wds[j] << 16);
            acc = acc + qg[8 * c + 2 * j + 1] * __uint_as_float(wds[j] & 0xffff0000u);
          }
        }
      } else {
        for (int d = 0; d < D; ++d) acc = acc + qg[d] * wb_load(k, base + d, dt);
      }
      acc = acc * qscale;
    }
    sc[g * P + t] = acc;
  }
  __syncthreads();
  if (threadIdx.x < G) {  // per head: max, exp2, sequential sum, rounding of p
    const int g = threadIdx.x;
    float m = -INFINITY;
    for (int t = 0; t < P; ++t) m = fmaxf(m, sc[g * P + t]);
    float l = 0.0f;
    if (m != -INFINITY)
      for (int t = 0; t < P; ++t) {
        float p = slot[t] >= 0 ? exp2f(sc[g * P + t] - m) : 0.0f;
        l = l + p;
        sc[g * P + t] = wb_round_to(p, prob_dt);
      }
    else
      for (int t = 0; t < P; ++t) sc[g * P + t] = 0.0f;
    red[g] = m;
    red[QSA_MAXG + g] = l;
  }
  __syncthreads();
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float acc[QSA_MAXG];
#pragma unroll
    for (int g = 0; g < QSA_MAXG; ++g) acc[g] = 0.0f;
    for (int t = 0; t < P; ++t) {
      if (slot[t] < 0) continue;
      const float vv = wb_load(v, (slot[t] * HKV + hk) * D + d, dt);
#pragma unroll
      for (int g = 0; g < QSA_MAXG; ++g)
        if (g < G) acc[g] = acc[g] + sc[g * P + t] * vv;
    }
#pragma unroll
    for (int g = 0; g < QSA_MAXG; ++g)
      if (g < G) {
        const float l = red[QSA_MAXG + g];
        const int64_t row = ((int64_t)b * HQ + hk * G + g) * S + s;
        o_parts[row * D + d] = l > 0.0f ? acc[g] / l : 0.0f;
        if (d == 0) lse_parts[row] = l > 0.0f ? red[g] + log2f(l) : -INFINITY;
      }
  }
}

__global__ void qsa_merge_kernel(const float* __restrict__ o_parts, const float* __restrict__ lse_parts, int S, int D,
                                 float* __restrict__ o, float* __restrict__ lse) {
  const int r = blockIdx.x;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float l;
    o[(int64_t)r * D + d] = wb_merge_elem(o_parts + (int64_t)r * S * D, lse_parts + (int64_t)r * S, S, D, d, &l);
    if (d == 0) lse[r] = l;
  }
}

extern "C" int qsa_decode_cuda(const void* q, const void* k, const void* v, const int32_t* idx, const int32_t* bt,
                               int mode, int B, int HQ, int HKV, int D, int ps, int max_pages, int L, int S, int P,
                               float qscale, int dt, int prob_dt, float* o_parts, float* lse_parts, float* o,
                               float* lse, void* stream) {
  const int G = HQ / HKV;
  if (G > QSA_MAXG) return 2;
  size_t smem = (size_t)(G * D + G * P + 2 * QSA_MAXG + 2) * sizeof(float) + (size_t)P * sizeof(long long) + 8;
  if (smem > 48 * 1024) {
    if (cudaFuncSetAttribute(qsa_split_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess)
      return 3;
  }
  cudaStream_t st = (cudaStream_t)stream;
  dim3 grid(B * HKV, S);
  qsa_split_kernel<<<grid, D < 128 ? 128 : D, smem, st>>>(q, k, v, idx, bt, mode, HQ, HKV, D, ps, max_pages, L, S, P,
                                                          qscale, dt, prob_dt, o_parts, lse_parts);
  qsa_merge_kernel<<<B * HQ, D < 32 ? 32 : (D > 256 ? 256 : D), 0, st>>>(o_parts, lse_parts, S, D, o, lse);
  return (int)cudaGetLastError();
}

extern "C" int qsa_merge_cuda(const float* o_parts, const float* lse_parts, int rows, int S, int D, float* o,
                              float* lse, void* stream) {
  qsa_merge_kernel<<<rows, D < 32 ? 32 : (D > 256 ? 256 : D), 0, (cudaStream_t)stream>>>(o_parts, lse_parts, S, D, o,
                                                                                       lse);
  return (int)cudaGetLastError();
}
