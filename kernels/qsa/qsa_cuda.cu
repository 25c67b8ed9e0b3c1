// CUDA build of the QSA split-KV decode.
//
// Two split kernels produce per-split outputs and base-2 LSE; qsa_merge_kernel merges them.
// Both split kernels serve the G = HQ / HKV query heads of one KV head in one block per
// (b, kv head, split), so each K/V row is read once per group, and both follow the numerics of
// the CPU build (qsa_cpu.cpp): base-2 scores (q.k) * qscale, per-split max, p = 2^(s - m), the
// sum l of the unrounded p, p rounded to prob_dt before P.V, fp32 accumulators, -1 skipped,
// duplicates counted, empty split -> o 0, lse -inf. Every reduction order is fixed by the block
// shape, so results are deterministic; they differ from the sequential CPU build in the last bits.
//
// qsa_fast_kernel<D, GT, DT> (D in {64, 128, 256}, G <= GT <= 16, fp32/bf16/fp16 inputs):
//   lanes own 8 consecutive head-dim columns, so a K or V row is D/8 lanes reading 16 bytes each
//   (a warp covers 32/(D/8) rows per load, coalesced); each lane group takes U tokens per step and
//   loads the rows of the next step into a second register buffer while this step computes
//   (memory-level parallelism; the two buffers alternate, nothing is copied between them).
//   scores: q of the G heads held in registers (G x 8 per lane); per token a lane forms G partial
//     dots of 8 products, and a transposed butterfly over the partials of two tokens (halves
//     exchanged at each level, the shuffles of a level independent: 31 shuffles for two tokens at
//     G = 12 instead of 2 x 12 x 5) leaves each lane complete scores. Scores and then rounded
//     probabilities sit in shared memory as [token][G].
//   P.V: the same token-to-lane-group mapping; each lane keeps G x 8 fp32 accumulators and reads
//     the G probabilities of its token as broadcast float4. The partition is padded to whole
//     double steps with rows of p = 0 and V = 0, so the loop has no branch. The per-group partial sums
//     are then added in a fixed order (group 0, 1, ...) through shared memory.
//   Registers: ~180 at G = 12 (one block of 8 warps or two of 4 per multiprocessor).
// qsa_split_kernel: the generic fallback (any D % 8 == 0, G <= 16), one warp per token for scores
//   with G butterflies, one thread per head-dim column sequential over the tokens for P.V.
#include <cuda_runtime.h>
#include "qsa/qsa_abi.h"
#include "qsa/qsa_elem.h"

#define QSA_MAXG 16
#define QSA_THREADS 256
#define QSA_FULL 0xffffffffu

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
  for (int off = 16; off > 0; off >>= 1) a = a + __shfl_xor_sync(QSA_FULL, a, off);
  return a;
}

__device__ __forceinline__ float qsa_warp_max(float a) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) a = fmaxf(a, __shfl_xor_sync(QSA_FULL, a, off));
  return a;
}

// ---------------------------------------------------------------------------------------------
// fast path

// 8 consecutive elements of a row in the input dtype, as raw bits (16 bytes, or 32 for fp32)
template <int DT>
struct QsaRow8 {
  uint4 u[DT == WB_FP32 ? 2 : 1];
};

template <int DT>
__device__ __forceinline__ void qsa_fetch(const void* p, int64_t i, QsaRow8<DT>& r) {
  if (DT == WB_FP32) {
    const uint4* a = (const uint4*)((const float*)p + i);
    r.u[0] = __ldg(a);
    r.u[DT == WB_FP32 ? 1 : 0] = __ldg(a + 1);
  } else {
    r.u[0] = __ldg((const uint4*)((const uint16_t*)p + i));
  }
}

template <int DT>
__device__ __forceinline__ void qsa_clear(QsaRow8<DT>& r) {
#pragma unroll
  for (int j = 0; j < (DT == WB_FP32 ? 2 : 1); ++j) r.u[j] = make_uint4(0u, 0u, 0u, 0u);
}

// exact conversion to fp32
template <int DT>
__device__ __forceinline__ void qsa_unpack(const QsaRow8<DT>& r, float* f) {
  if (DT == WB_FP32) {
    const uint32_t w[8] = {r.u[0].x, r.u[0].y, r.u[0].z, r.u[0].w,
                           r.u[DT == WB_FP32 ? 1 : 0].x, r.u[DT == WB_FP32 ? 1 : 0].y,
                           r.u[DT == WB_FP32 ? 1 : 0].z, r.u[DT == WB_FP32 ? 1 : 0].w};
#pragma unroll
    for (int j = 0; j < 8; ++j) f[j] = __uint_as_float(w[j]);
  } else {
    const uint32_t w[4] = {r.u[0].x, r.u[0].y, r.u[0].z, r.u[0].w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (DT == WB_BF16) {
        f[2 * j] = __uint_as_float(w[j] << 16);
        f[2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
      } else {
        __half2_raw h;
        h.x = (unsigned short)(w[j] & 0xffffu);
        h.y = (unsigned short)(w[j] >> 16);
        const float2 x = __half22float2(__half2(h));
        f[2 * j] = x.x;
        f[2 * j + 1] = x.y;
      }
    }
  }
}

__host__ __device__ constexpr int qsa_pow2_at_least(int n) { return n <= 1 ? 1 : 2 * qsa_pow2_at_least((n + 1) / 2); }

// Sum GP per-lane partials over the LPR lanes of a group (lane bits below LPR). Transposed
// butterfly: at the step with offset o each lane keeps half of its remaining values (the upper
// half where its bit o is set) and adds its partner's copy of that half. Afterwards lane `col`
// holds the complete sums of heads g0 .. g0 + NF - 1 in v[0..NF-1]; while halving stops at one
// value, the remaining steps are plain butterflies, so lanes that differ only in those low bits
// hold equal copies (owner() picks one). The pair sums equal those of a plain butterfly.
template <int GP, int LPR>
struct QsaTreeSum {
  static constexpr int NF = GP > LPR ? GP / LPR : 1;
  static __device__ __forceinline__ int run(float (&v)[GP], int col) {
    int g0 = 0;
#pragma unroll
    for (int o = LPR / 2, n = GP; o >= 1; o >>= 1) {
      if (n > 1) {
        const int h = n / 2;
        const bool up = (col & o) != 0;
#pragma unroll
        for (int i = 0; i < GP / 2; ++i)
          if (i < h) {
            const float send = up ? v[i] : v[i + h];
            const float keep = up ? v[i + h] : v[i];
            v[i] = keep + __shfl_xor_sync(QSA_FULL, send, o);
          }
        if (up) g0 += h;
        n = h;
      } else {
        v[0] = v[0] + __shfl_xor_sync(QSA_FULL, v[0], o);
      }
    }
    return g0;
  }
  static __device__ __forceinline__ bool owner(int col) { return GP >= LPR || (col & (LPR / GP - 1)) == 0; }
};

// tokens each lane group keeps in flight (and reduces together in the score tree)
__host__ __device__ constexpr int qsa_fast_u(int GT, int DT) { return (GT > 12 || DT == WB_FP32) ? 2 : 4; }

template <int D, int GT, int DT>
__global__ void __launch_bounds__(QSA_THREADS) qsa_fast_kernel(
    const void* __restrict__ q, const void* __restrict__ k, const void* __restrict__ v,
    const int32_t* __restrict__ idx, const int32_t* __restrict__ bt, int mode, int HQ, int HKV, int ps,
    int max_pages, int L, int S, int P, float qscale, int prob_dt, float* __restrict__ o_parts,
    float* __restrict__ lse_parts) {
  constexpr int LPR = D / 8;                   // lanes per K/V row
  constexpr int TPW = 32 / LPR;                // rows per warp
  constexpr int GS = (GT + 3) & ~3;            // row stride of the [token][G] probabilities
  constexpr int GP = qsa_pow2_at_least(GT);    // partials per token in the score tree
  constexpr int U = qsa_fast_u(GT, DT);        // tokens per lane group per step
  constexpr int TU = U < 2 ? U : 2;            // tokens per score tree (registers: TU x GP partials)
  using Tree = QsaTreeSum<TU * GP, LPR>;
  extern __shared__ float4 sm4[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int sub = lane / LPR, col = lane % LPR;
  const int NR = nw * TPW;                     // lane groups (rows in flight) per block
  const int step = NR * U;
  const int PP = (P + 2 * step - 1) / (2 * step) * (2 * step);  // padded to whole double steps (rows past P: no token)
  float* stat = (float*)sm4;                   // [GT] max, [GT] sum
  float* pr = stat + 2 * QSA_MAXG;             // [PP][GS] scores, then rounded probabilities
  long long* off = (long long*)(pr + PP * GS); // [PP] element offset of the K/V row, -1: none
  float* red = pr;                             // [NR][GT][D] P.V partials (after P.V, aliases pr/off)

  const int G = HQ / HKV;
  const int b = blockIdx.x / HKV, hk = blockIdx.x % HKV, s = blockIdx.y;
  for (int t = threadIdx.x; t < PP; t += blockDim.x) {
    const int tt = s * P + t;
    const long long sl = (t < P && tt < L) ? wb_slot(idx, bt, mode, b, tt, L, max_pages, ps) : -1;
    off[t] = sl < 0 ? -1 : (sl * HKV + hk) * D;
  }
  float qr[GT][8];
#pragma unroll
  for (int g = 0; g < GT; ++g) {
    if (g < G) {
      QsaRow8<DT> r;
      qsa_fetch<DT>(q, ((int64_t)b * HQ + hk * G + g) * D + 8 * col, r);
      qsa_unpack<DT>(r, qr[g]);
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) qr[g][j] = 0.0f;
    }
  }
  __syncthreads();

  // Rows of K (then V) for the U tokens t0 + sub + u * NR of lane group `sub` of a warp, into one
  // of two register buffers: the loop alternates them, so the rows of the next step are in flight
  // while this step computes (no register copy between the buffers, which would wait for them).
  auto fetch = [&](const void* src, QsaRow8<DT>(&buf)[U], int t0) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int t = t0 + sub + u * NR;
      const long long o = t < PP ? off[t] : -1;
      if (o >= 0) qsa_fetch<DT>(src, o + 8 * col, buf[u]); else qsa_clear<DT>(buf[u]);
    }
  };

  // scores: the TU x GP partials of TU tokens go through one transposed tree, so the shuffles of a
  // tree level are independent of each other. Rows without a token compute on zeros and store -inf.
  auto scores = [&](const QsaRow8<DT>(&buf)[U], int t0) {
#pragma unroll
    for (int h = 0; h < U; h += TU) {
      float part[TU * GP];
#pragma unroll
      for (int u = 0; u < TU; ++u) {
        float kf[8];
        qsa_unpack<DT>(buf[h + u], kf);
#pragma unroll
        for (int g = 0; g < GP; ++g) {
          float a = 0.0f;
          if (g < GT) {
            a = qr[g][0] * kf[0];
#pragma unroll
            for (int j = 1; j < 8; ++j) a = a + qr[g][j] * kf[j];
          }
          part[u * GP + g] = a;
        }
      }
      const int c0 = Tree::run(part, col);
      if (Tree::owner(col)) {
#pragma unroll
        for (int i = 0; i < Tree::NF; ++i) {
          const int u = h + (c0 + i) / GP, g = (c0 + i) % GP;
          const int t = t0 + sub + u * NR;
          if (g < G) pr[t * GS + g] = off[t] >= 0 ? part[i] * qscale : -INFINITY;
        }
      }
    }
  };
  {
    QsaRow8<DT> ba[U], bb[U];
    fetch(k, ba, warp * TPW);
    for (int t0 = warp * TPW; t0 < PP; t0 += 2 * step) {  // PP is a multiple of 2 x step
      fetch(k, bb, t0 + step);
      scores(ba, t0);
      fetch(k, ba, t0 + 2 * step);
      scores(bb, t0 + step);
    }
  }
  __syncthreads();

  // softmax of each head over the split: max, p = 2^(s - m), l = sum of unrounded p, p rounded;
  // rows without a token (padding included) get p = 0
  for (int g = warp; g < G; g += nw) {
    float m = -INFINITY;
    for (int t = lane; t < P; t += 32) m = fmaxf(m, pr[t * GS + g]);
    m = qsa_warp_max(m);
    float l = 0.0f;
    for (int t = lane; t < PP; t += 32) {
      const float p = (m != -INFINITY && off[t] >= 0) ? exp2f(pr[t * GS + g] - m) : 0.0f;
      l = l + p;
      pr[t * GS + g] = wb_round_to(p, prob_dt);
    }
    l = qsa_warp_sum(l);
    if (lane == 0) {
      stat[g] = m;
      stat[QSA_MAXG + g] = l;
    }
  }
  __syncthreads();

  // P.V: each lane group sums its tokens in increasing order into G x 8 accumulators. Rows without
  // a token have p = 0 and V = 0 (not loaded), adding +0 to accumulators that start at +0 leaves
  // them unchanged, so the loop needs no branch.
  float acc[GT][8];
#pragma unroll
  for (int g = 0; g < GT; ++g)
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[g][j] = 0.0f;
  auto pv = [&](const QsaRow8<DT>(&buf)[U], int t0) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int t = t0 + sub + u * NR;
      float vf[8];
      qsa_unpack<DT>(buf[u], vf);
      float p[GS];
#pragma unroll
      for (int c = 0; c < GS / 4; ++c) {
        const float4 x = ((const float4*)(pr + t * GS))[c];
        p[4 * c] = x.x; p[4 * c + 1] = x.y; p[4 * c + 2] = x.z; p[4 * c + 3] = x.w;
      }
#pragma unroll
      for (int g = 0; g < GT; ++g)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[g][j] = acc[g][j] + p[g] * vf[j];
    }
  };
  {
    QsaRow8<DT> ba[U], bb[U];
    fetch(v, ba, warp * TPW);
    for (int t0 = warp * TPW; t0 < PP; t0 += 2 * step) {
      fetch(v, bb, t0 + step);
      pv(ba, t0);
      fetch(v, ba, t0 + 2 * step);
      pv(bb, t0 + step);
    }
  }
  __syncthreads();  // red aliases pr and off
  const int r = warp * TPW + sub;
#pragma unroll
  for (int g = 0; g < GT; ++g) {
    float4* dst = (float4*)(red + ((size_t)r * GT + g) * D + 8 * col);
    dst[0] = make_float4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]);
    dst[1] = make_float4(acc[g][4], acc[g][5], acc[g][6], acc[g][7]);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < G * D; e += blockDim.x) {
    const int g = e / D, d = e % D;
    float a = red[(size_t)g * D + d];
    for (int rr = 1; rr < NR; ++rr) a = a + red[((size_t)rr * GT + g) * D + d];
    const float l = stat[QSA_MAXG + g];
    const int64_t row = ((int64_t)b * HQ + hk * G + g) * S + s;
    o_parts[row * D + d] = l > 0.0f ? a / l : 0.0f;
    if (d == 0) lse_parts[row] = l > 0.0f ? stat[g] + log2f(l) : -INFINITY;
  }
}

// ---------------------------------------------------------------------------------------------
// generic fallback

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

// merge of one row per block: the S weights 2^(lse_s - max) once in shared memory, then each
// thread sums its columns over s in order; the same arithmetic as wb_merge_elem (CPU build)
__global__ void qsa_merge_kernel(const float* __restrict__ o_parts, const float* __restrict__ lse_parts, int S, int D,
                                 float* __restrict__ o, float* __restrict__ lse) {
  extern __shared__ float w[];  // [S] weights, [1] their sum, [1] the max
  const int r = blockIdx.x;
  const float* lp = lse_parts + (int64_t)r * S;
  if (threadIdx.x < 32) {
    float m = -INFINITY;
    for (int s = threadIdx.x; s < S; s += 32) m = fmaxf(m, lp[s]);
    m = qsa_warp_max(m);
    if (threadIdx.x == 0) w[S + 1] = m;
  }
  __syncthreads();
  const float m = w[S + 1];
  for (int s = threadIdx.x; s < S; s += blockDim.x) w[s] = exp2f(lp[s] - m);
  __syncthreads();
  if (threadIdx.x == 0) {
    float sw = 0.0f;
    for (int s = 0; s < S; ++s) sw = sw + w[s];
    w[S] = sw;
    lse[r] = m == -INFINITY ? -INFINITY : m + log2f(sw);
  }
  __syncthreads();
  const float sw = w[S];
  const float* op = o_parts + (int64_t)r * S * D;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.0f;
    if (m != -INFINITY) {
      for (int s = 0; s < S; ++s) acc = acc + w[s] * op[(int64_t)s * D + d];
      acc = acc / sw;
    }
    o[(int64_t)r * D + d] = acc;
  }
}

// the same merge for any S (no shared memory; every thread recomputes the weights)
__global__ void qsa_merge_elem_kernel(const float* __restrict__ o_parts, const float* __restrict__ lse_parts, int S,
                                      int D, float* __restrict__ o, float* __restrict__ lse) {
  const int r = blockIdx.x;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float l;
    o[(int64_t)r * D + d] = wb_merge_elem(o_parts + (int64_t)r * S * D, lse_parts + (int64_t)r * S, S, D, d, &l);
    if (d == 0) lse[r] = l;
  }
}

static void qsa_merge_launch(const float* o_parts, const float* lse_parts, int rows, int S, int D, float* o, float* lse,
                             cudaStream_t st) {
  const int threads = D < 32 ? 32 : (D > 256 ? 256 : (D + 31) / 32 * 32);
  const size_t smem = (size_t)(S + 2) * sizeof(float);
  if (smem <= 48 * 1024)
    qsa_merge_kernel<<<rows, threads, smem, st>>>(o_parts, lse_parts, S, D, o, lse);
  else
    qsa_merge_elem_kernel<<<rows, threads, 0, st>>>(o_parts, lse_parts, S, D, o, lse);
}

// ---------------------------------------------------------------------------------------------
// launchers

struct QsaArgs {
  const void *q, *k, *v;
  const int32_t *idx, *bt;
  int mode, B, HQ, HKV, D, ps, max_pages, L, S, P;
  float qscale;
  int dt, prob_dt;
  float *o_parts, *lse_parts;
};

#define QSA_MAX_DEVICES 64

static int qsa_device() {
  int dev = 0;
  cudaGetDevice(&dev);
  return dev < 0 || dev >= QSA_MAX_DEVICES ? 0 : dev;
}

// (multiprocessors, opt-in shared memory per block) of the current device, read once
static int qsa_device_attr(int which) {
  static int cache[QSA_MAX_DEVICES][2];
  const int dev = qsa_device();
  if (!cache[dev][0]) {
    cudaDeviceGetAttribute(&cache[dev][1], cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    cudaDeviceGetAttribute(&cache[dev][0], cudaDevAttrMultiProcessorCount, dev);
  }
  return cache[dev][which];
}
#define QSA_SMS 0
#define QSA_SMEM_OPTIN 1

// Kernels must opt in to more than 48 KiB of dynamic shared memory. `granted` (one per kernel
// and device) remembers what was set, so a launch repeated inside CUDA-graph capture makes no
// further attribute calls.
static int qsa_allow_smem(const void* fn, size_t smem, size_t* granted) {
  if (smem <= 48 * 1024) return 0;
  if (smem > (size_t)qsa_device_attr(QSA_SMEM_OPTIN)) return WB_ERR_SHARED_MEM;
  size_t& g = granted[qsa_device()];
  if (smem <= g) return 0;
  if (cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess)
    return WB_ERR_SHARED_MEM;
  g = smem;
  return 0;
}

static size_t qsa_fast_smem(int D, int GT, int DT, int P, int warps) {
  const int GS = (GT + 3) & ~3, step2 = 2 * warps * (32 / (D / 8)) * qsa_fast_u(GT, DT);
  const size_t PP = (size_t)(P + step2 - 1) / step2 * step2;
  const size_t scores = PP * GS * sizeof(float) + PP * sizeof(long long);
  const size_t partials = (size_t)warps * (32 / (D / 8)) * GT * D * sizeof(float);
  return 2 * QSA_MAXG * sizeof(float) + (scores > partials ? scores : partials);
}

template <int D, int GT, int DT>
static int qsa_fast_launch(const QsaArgs& a, int warps, cudaStream_t st) {
  const size_t smem = qsa_fast_smem(D, GT, DT, a.P, warps);
  static size_t granted[QSA_MAX_DEVICES];
  if (int rc = qsa_allow_smem((const void*)qsa_fast_kernel<D, GT, DT>, smem, granted)) return rc;
  dim3 grid(a.B * a.HKV, a.S);
  qsa_fast_kernel<D, GT, DT><<<grid, warps * 32, smem, st>>>(a.q, a.k, a.v, a.idx, a.bt, a.mode, a.HQ, a.HKV, a.ps,
                                                             a.max_pages, a.L, a.S, a.P, a.qscale, a.prob_dt,
                                                             a.o_parts, a.lse_parts);
  return 0;
}

template <int D, int GT>
static int qsa_fast_dt(const QsaArgs& a, int warps, cudaStream_t st) {
  if (a.dt == WB_BF16) return qsa_fast_launch<D, GT, WB_BF16>(a, warps, st);
  if (a.dt == WB_FP16) return qsa_fast_launch<D, GT, WB_FP16>(a, warps, st);
  return qsa_fast_launch<D, GT, WB_FP32>(a, warps, st);
}

template <int D>
static int qsa_fast_g(const QsaArgs& a, int GT, int warps, cudaStream_t st) {
  switch (GT) {
    case 1: return qsa_fast_dt<D, 1>(a, warps, st);
    case 2: return qsa_fast_dt<D, 2>(a, warps, st);
    case 4: return qsa_fast_dt<D, 4>(a, warps, st);
    case 8: return qsa_fast_dt<D, 8>(a, warps, st);
    case 12: return qsa_fast_dt<D, 12>(a, warps, st);
    default: return qsa_fast_dt<D, 16>(a, warps, st);
  }
}

// the compiled head-count bound for G query heads per KV head (0: no fast kernel)
static int qsa_fast_gt(int G) {
  const int gts[6] = {1, 2, 4, 8, 12, 16};
  for (int i = 0; i < 6; ++i)
    if (G <= gts[i]) return gts[i];
  return 0;
}

// warps per block of the fast kernel: 8 while there are no more blocks than multiprocessors, else 4
// (a lane holds ~G x 8 floats, so a multiprocessor fits one block of 8 warps at G = 12, or three
// of 4; measured on the H200 at B = 1..16, 2026-11-29)
static int qsa_fast_warps(int blocks, int requested) {
  if (requested >= 1 && requested <= QSA_THREADS / 32) return requested;
  return blocks <= qsa_device_attr(QSA_SMS) ? 8 : 4;
}

// which split kernel serves these arguments: 1 fast, 0 generic
static int qsa_pick(const QsaArgs& a, int warps) {
  const int G = a.HQ / a.HKV, GT = qsa_fast_gt(G);
  if (GT == 0 || !(a.D == 64 || a.D == 128 || a.D == 256)) return 0;
  if (!(a.dt == WB_FP32 || a.dt == WB_BF16 || a.dt == WB_FP16)) return 0;
  return qsa_fast_smem(a.D, GT, a.dt, a.P, warps) <= (size_t)qsa_device_attr(QSA_SMEM_OPTIN);
}

// QsaDecodeArgs -> o_parts, lse_parts, o, lse. Returns WB_OK, WB_ERR_SHAPE (more than 16 query
// heads per KV head, D not a multiple of 8, or kernel 1 forced on a shape the fast kernel does not
// serve), WB_ERR_SHARED_MEM (shared memory too large for the partition), or a cudaError_t code.
// `warps` (0: auto) sets the fast kernel's block size; `kernel` (0 auto, 1 fast, 2 generic) is for
// tests and benchmarks.
extern "C" int qsa_decode_cuda(const QsaDecodeArgs* args) {
  const void *q = args->q, *k = args->k, *v = args->v;
  const int32_t *idx = args->idx, *bt = args->bt;
  const int mode = args->mode, B = args->B, HQ = args->HQ, HKV = args->HKV, D = args->D, ps = args->ps;
  const int max_pages = args->max_pages, L = args->L, S = args->S, P = args->P, dt = args->dt;
  const int prob_dt = args->prob_dt, warps = args->warps, kernel = args->kernel;
  const float qscale = args->qscale;
  float *o_parts = args->o_parts, *lse_parts = args->lse_parts, *o = args->o, *lse = args->lse;
  if (HKV < 1 || HQ % HKV) return WB_ERR_SHAPE;
  const int G = HQ / HKV;
  if (G > QSA_MAXG || D % 8) return WB_ERR_SHAPE;
  cudaStream_t st = (cudaStream_t)args->stream;
  const QsaArgs a{q, k, v, idx, bt, mode, B, HQ, HKV, D, ps, max_pages, L, S, P, qscale, dt, prob_dt,
                  o_parts, lse_parts};
  const int nw = qsa_fast_warps(B * HKV * S, warps);
  const int fast = kernel == 1 || (kernel == 0 && qsa_pick(a, nw));
  if (fast) {
    if (!qsa_fast_gt(G) || !(D == 64 || D == 128 || D == 256)) return WB_ERR_SHAPE;
    int rc = 0;
    switch (D) {
      case 64: rc = qsa_fast_g<64>(a, qsa_fast_gt(G), nw, st); break;
      case 128: rc = qsa_fast_g<128>(a, qsa_fast_gt(G), nw, st); break;
      default: rc = qsa_fast_g<256>(a, qsa_fast_gt(G), nw, st); break;
    }
    if (rc) return rc;
  } else {
    const size_t smem =
        (size_t)(G * D + G * P + 2 * QSA_MAXG + 2) * sizeof(float) + (size_t)P * sizeof(long long) + 8;
    static size_t granted[QSA_MAX_DEVICES];
    if (int rc = qsa_allow_smem((const void*)qsa_split_kernel, smem, granted)) return rc;
    dim3 grid(B * HKV, S);
    qsa_split_kernel<<<grid, QSA_THREADS, smem, st>>>(q, k, v, idx, bt, mode, HQ, HKV, D, ps, max_pages, L, S, P,
                                                      qscale, dt, prob_dt, o_parts, lse_parts);
  }
  qsa_merge_launch(o_parts, lse_parts, B * HQ, S, D, o, lse, st);
  return (int)cudaGetLastError();
}

// QsaMergeArgs -> o, lse. Returns WB_OK or a cudaError_t code.
extern "C" int qsa_merge_cuda(const QsaMergeArgs* a) {
  qsa_merge_launch(a->o_parts, a->lse_parts, a->rows, a->S, a->D, a->o, a->lse, (cudaStream_t)a->stream);
  return (int)cudaGetLastError();
}

QSA_ARGS_LAYOUT
WB_DEFINE_STATUS_NAME
