// Gated DeltaNet element code shared by the CPU build (gdn_cpu.cpp) and the CUDA build
// (gdn_cuda.cu). Layouts (row-major, float32): q, k [B,T,H,K]; v, o [B,T,HV,V]; g, beta [B,T,HV];
// state [B,HV,K,V]. Value head hv reads q/k head hv / (HV / H).
//
// Per step: S = exp(g) S; u = beta (v - S^T k); S = S + k u^T; o = scale S^T q.
// Storage is float32; dot products accumulate in Acc (float or double, the policy's accum_dtype).
#pragma once

#include <math.h>

#ifdef __CUDACC__
#define GDN_HD __host__ __device__ __forceinline__
#else
#define GDN_HD inline
#endif

namespace gdn {

GDN_HD int imin(int a, int b) { return a < b ? a : b; }

template <typename Acc> GDN_HD Acc expo(Acc x) { return exp(x); }
template <> GDN_HD float expo<float>(float x) { return expf(x); }

// Delta-rule write of one state column: u = beta (v - decay * (S^T k)) given kv = S_old^T k.
template <typename Acc>
GDN_HD Acc delta_u(Acc beta, Acc v, Acc decay, Acc kv) { return beta * (v - decay * kv); }

// One state element after the step: decay * s + k u.
template <typename Acc>
GDN_HD float state_update(float s, Acc decay, float k, Acc u) {
  return (float)(decay * (Acc)s + (Acc)k * u);
}

GDN_HD long qk_index(int b, int t, int h, int T, int H, int K) {
  return (((long)b * T + t) * H + h) * K;
}
GDN_HD long v_index(int b, int t, int hv, int T, int HV, int V) {
  return (((long)b * T + t) * HV + hv) * V;
}
GDN_HD long gate_index(int b, int t, int hv, int T, int HV) { return ((long)b * T + t) * HV + hv; }
GDN_HD long state_index(int b, int hv, int HV, int K, int V) { return ((long)b * HV + hv) * K * V; }

// Bytes of scratch one tile of the chunked form needs (see chunked_tile).
GDN_HD long chunk_scratch_floats(int C, int K, int BV) {
  return (long)C * C + (long)K * BV + (long)C * BV + 2L * C * K + 2L * C;
}

// Chunked (UT/WY) form of the recurrence for one (b, hv) and one tile of BV value columns
// starting at c0, executed cooperatively by nt threads (thread tid) that call sync() between
// phases. On the CPU nt = 1 and sync is a no-op; on the GPU the scratch is shared memory.
//
// Per chunk of L <= C steps, with gc the within-chunk cumulative log decay:
//   A[i][j] = beta_i (k_i . k_j) exp(gc_i - gc_j)  (j < i)
//   (I + A) U = beta (V - exp(gc) K S)               (forward substitution)
//   o_i = scale (exp(gc_i) q_i S + sum_{j<=i} (q_i . k_j) exp(gc_i - gc_j) U_j)
//   S  = exp(gc_last) S + sum_j exp(gc_last - gc_j) k_j U_j^T
template <typename Acc, typename Sync>
GDN_HD void chunked_tile(const float* q, const float* k, const float* v, const float* g,
                         const float* beta, float* o, float* state, int T, int H, int HV, int K,
                         int V, float scale, int C, int b, int hv, int c0, int BV, int tid, int nt,
                         Sync sync, float* scratch) {
  float* A = scratch;            // [C][C]
  float* S = A + C * C;          // [K][BV]
  float* R = S + K * BV;         // [C][BV]
  float* Ks = R + C * BV;        // [C][K]
  float* Qs = Ks + C * K;        // [C][K]
  float* gc = Qs + C * K;        // [C]
  float* bt = gc + C;            // [C]
  const int h = hv / (HV / H);
  const int bv = imin(BV, V - c0);
  float* st = state + state_index(b, hv, HV, K, V);
  for (int i = tid; i < K * bv; i += nt) S[(i / bv) * BV + i % bv] = st[(long)(i / bv) * V + c0 + i % bv];
  for (int t0 = 0; t0 < T; t0 += C) {
    const int L = imin(C, T - t0);
    sync();
    for (int i = tid; i < L * K; i += nt) {
      const long src = qk_index(b, t0 + i / K, h, T, H, K) + i % K;
      Ks[i] = k[src];
      Qs[i] = q[src];
    }
    if (tid == 0) {
      Acc acc = 0;
      for (int i = 0; i < L; ++i) {
        acc += (Acc)g[gate_index(b, t0 + i, hv, T, HV)];
        gc[i] = (float)acc;
        bt[i] = beta[gate_index(b, t0 + i, hv, T, HV)];
      }
    }
    sync();
    for (int idx = tid; idx < L * L; idx += nt) {
      const int i = idx / L, j = idx % L;
      if (j < i) {
        Acc d = 0;
        for (int kk = 0; kk < K; ++kk) d += (Acc)Ks[i * K + kk] * (Acc)Ks[j * K + kk];
        A[i * C + j] = (float)((Acc)bt[i] * d * expo<Acc>((Acc)gc[i] - (Acc)gc[j]));
      }
    }
    for (int idx = tid; idx < L * bv; idx += nt) {
      const int i = idx / bv, c = idx % bv;
      Acc ks = 0, qs = 0;
      for (int kk = 0; kk < K; ++kk) {
        ks += (Acc)Ks[i * K + kk] * (Acc)S[kk * BV + c];
        qs += (Acc)Qs[i * K + kk] * (Acc)S[kk * BV + c];
      }
      const Acc decay = expo<Acc>((Acc)gc[i]);
      const Acc vi = (Acc)v[v_index(b, t0 + i, hv, T, HV, V) + c0 + c];
      R[i * BV + c] = (float)delta_u<Acc>((Acc)bt[i], vi, decay, ks);
      // the inter-chunk part of o, finished below by the same thread
      o[v_index(b, t0 + i, hv, T, HV, V) + c0 + c] = (float)(decay * qs);
    }
    sync();
    for (int i = 1; i < L; ++i) {
      for (int c = tid; c < bv; c += nt) {
        Acc acc = (Acc)R[i * BV + c];
        for (int j = 0; j < i; ++j) acc -= (Acc)A[i * C + j] * (Acc)R[j * BV + c];
        R[i * BV + c] = (float)acc;
      }
      sync();
    }
    for (int idx = tid; idx < L * L; idx += nt) {
      const int i = idx / L, j = idx % L;
      if (j <= i) {
        Acc d = 0;
        for (int kk = 0; kk < K; ++kk) d += (Acc)Qs[i * K + kk] * (Acc)Ks[j * K + kk];
        A[i * C + j] = (float)(d * expo<Acc>((Acc)gc[i] - (Acc)gc[j]));
      }
    }
    sync();
    for (int idx = tid; idx < L * bv; idx += nt) {
      const int i = idx / bv, c = idx % bv;
      Acc acc = 0;
      for (int j = 0; j <= i; ++j) acc += (Acc)A[i * C + j] * (Acc)R[j * BV + c];
      float* out = o + v_index(b, t0 + i, hv, T, HV, V) + c0 + c;
      *out = (float)((Acc)scale * ((Acc)*out + acc));
    }
    const Acc glast = (Acc)gc[L - 1];
    for (int idx = tid; idx < K * bv; idx += nt) {
      const int kk = idx / bv, c = idx % bv;
      Acc acc = expo<Acc>(glast) * (Acc)S[kk * BV + c];
      for (int j = 0; j < L; ++j)
        acc += (Acc)Ks[j * K + kk] * expo<Acc>(glast - (Acc)gc[j]) * (Acc)R[j * BV + c];
      S[kk * BV + c] = (float)acc;
    }
  }
  sync();
  for (int i = tid; i < K * bv; i += nt) st[(long)(i / bv) * V + c0 + i % bv] = S[(i / bv) * BV + i % bv];
}

}  // namespace gdn
