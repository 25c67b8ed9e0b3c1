// CUDA build of the QSA split-KV decode.
// kernel: one block of 256 threads per (b, kv head, split) serves the G = HQ / HKV query heads of
// that KV head, so each K/V row is read once per group. Scores: one warp per token, each lane a
// 16-byte chunk of the key row (coalesced), G partial dots combined by a fixed butterfly of warp
// shuffles. Softmax: one warp per head (max, exp2, rounding of p, butterfly sum). P.V: one thread
// per head-dim column holding G accumulators, sequential over the tokens. Every reduction order is
// fixed by the block shape, so results are deterministic (they differ from the sequential CPU
// build in the last bits).
#include <cuda_runtime.h>
#include "qsa/qsa_elem.h"

#define QSA_MAXG 16
#define QSA_THREADS 256

__device__ __forceinline__ void qsa_load8(const void* p, int64_t i, int dt, float* f) {
  if (dt == WB_BF16) {
    const uint4 u = __ldg((const uint4*)((const uint16_t*)p + i));
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      f[2 * j] = __uint_as_float(w[j] << 16);
      f[2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
    }
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) f[j] = wb_load(p, i + j, dt);
  }
}

__device__ __forceinline__ float qsa_warp_sum(float a) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) a = a + __shfl_xor_sync(0xffffffffu, a, off);
  return a;
}

__device__ __forceinline__ float qsa_warp_max(float a) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, off));
  return a;
}

__global__ void __launch_bounds__(QSA_THREADS) qsa_split_kernel(
    const void* __restrict__ q, const void* __restrict__ k, const void* __restrict__ v,
    const int32_t* __restrict__ idx, const int32_t* __restrict__ bt, int mode, int HQ, int HKV, int D, int ps,
    int max_pages, int L, int S, int P, float qscale, int dt, int prob_dt, float* __restrict__ o_parts,
    float* __restrict__ lse_parts) {
  extern __shared__ float4 sm4[];
  float* sm = (float*)sm4;
  const int G = HQ / HKV;
  const int b = blockIdx.x / HKV, hk = blockIdx.x % HKV, s = blockIdx.y;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  float* qs = sm;                 // [G][D] (D % 8 == 0: rows stay 16-byte aligned)
  float* sc = qs + G * D;         // [G][P] scores, then rounded probabilities
  float* red = sc + G * P;        // [G] max, [G] sum
  long long* slot = (long long*)(sm + ((G * D + G * P + 2 * QSA_MAXG + 2 + 1) & ~1));  // [P]
  for (int i = threadIdx.x; i < G * D; i += blockDim.x)
    qs[i] = wb_load(q, ((int64_t)b * HQ + hk * G + i / D) * D + i % D, dt);
  for (int t = threadIdx.x; t < P; t += blockDim.x) {
    int tt = s * P + t;
    slot[t] = tt < L ? wb_slot(idx, bt, mode, b, tt, L, max_pages, ps) : -1;
  }
  __syncthreads();
  for (int t = warp; t < P; t += nw) {
    const long long sl = slot[t];
    if (sl < 0) {  // warp-uniform
      if (lane < G) sc[lane * P + t] = -INFINITY;
      continue;
    }
    const int64_t base = (sl * HKV + hk) * D;
    float part[QSA_MAXG];
#pragma unroll
    for (int g = 0; g < QSA_MAXG; ++g) part[g] = 0.0f;
    for (int c = lane; c < D / 8; c += 32) {
      float kf[8];
      qsa_load8(k, base + 8 * c, dt, kf);
#pragma unroll
      for (int g = 0; g < QSA_MAXG; ++g)
        if (g < G) {
          const float4 a = ((const float4*)(qs + g * D))[2 * c];
          const float4 e = ((const float4*)(qs + g * D))[2 * c + 1];
          float acc = part[g];
          acc = acc + a.x * kf[0]; acc = acc + a.y * kf[1]; acc = acc + a.z * kf[2]; acc = acc + a.w * kf[3];
          acc = acc + e.x * kf[4]; acc = acc + e.y * kf[5]; acc = acc + e.z * kf[6]; acc = acc + e.w * kf[7];
          part[g] = acc;
        }
    }
#pragma unroll
    for (int g = 0; g < QSA_MAXG; ++g)
      if (g < G) {
        const float tot = qsa_warp_sum(part[g]);
        if (lane == 0) sc[g * P + t] = tot * qscale;
      }
  }
  __syncthreads();
  for (int g = warp; g < G; g += nw) {
    float m = -INFINITY;
    for (int t = lane; t < P; t += 32) m = fmaxf(m, sc[g * P + t]);
    m = qsa_warp_max(m);
    float l = 0.0f;
    for (int t = lane; t < P; t += 32) {
      const float p = (m != -INFINITY && slot[t] >= 0) ? exp2f(sc[g * P + t] - m) : 0.0f;
      l = l + p;
      sc[g * P + t] = wb_round_to(p, prob_dt);
    }
    l = qsa_warp_sum(l);
    if (lane == 0) {
      red[g] = m;
      red[QSA_MAXG + g] = l;
    }
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
  if (G > QSA_MAXG || D % 8) return 2;
  size_t smem = (size_t)(G * D + G * P + 2 * QSA_MAXG + 2) * sizeof(float) + (size_t)P * sizeof(long long) + 8;
  if (smem > 48 * 1024) {
    if (cudaFuncSetAttribute(qsa_split_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess)
      return 3;
  }
  cudaStream_t st = (cudaStream_t)stream;
  dim3 grid(B * HKV, S);
  qsa_split_kernel<<<grid, QSA_THREADS, smem, st>>>(q, k, v, idx, bt, mode, HQ, HKV, D, ps, max_pages, L, S, P,
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
