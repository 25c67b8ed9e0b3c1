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

// ---------------------------------------------------------------------------------------------
// Chunked (UT/WY) form in three phases. Per chunk of L <= C steps, with gc the within-chunk
// cumulative log decay and A[i][j] = beta_i (k_i . k_j) exp(gc_i - gc_j) for j < i:
//   1. prepare (every chunk in parallel): W = (I + A)^-1 (beta exp(gc) K), U = (I + A)^-1 (beta V)
//   2. state pass (sequential over chunks): U <- U - W S (the chunk's delta-rule values);
//      o_i <- exp(gc_i) q_i S; S <- exp(gc_last) S + sum_j k_j (exp(gc_last - gc_j) U_j)^T, the
//      decays computed once per chunk and the decayed U kept in shared memory
//   3. output (every chunk in parallel): o_i <- scale (o_i + sum_{j<=i} (q_i . k_j) exp(gc_i - gc_j) U_j)
// Workspace (float32): gcum [B,HV,T], W [B,HV,T,K], U [B,HV,T,V].
// Each phase function is run cooperatively by nt threads (thread tid) that call sync() between
// steps: on the CPU nt = 1 and sync is a no-op; on the GPU the scratch is shared memory.

GDN_HD long ws_row(int b, int hv, int t, int HV, int T) { return ((long)b * HV + hv) * T + t; }

// Scratch floats of phase 1 (stage_k: the chunk's keys are copied into the scratch).
GDN_HD long prepare_scratch_floats(int C, int K, bool stage_k) {
  return (long)C * C + 2L * C + (stage_k ? (long)C * K : 0L);
}
// Scratch floats of phase 3 (stage: the chunk's q and k are copied into the scratch).
GDN_HD long output_scratch_floats(int C, int K, bool stage) {
  return (long)C * C + C + (stage ? 2L * C * K : 0L);
}

template <typename Acc, typename Sync>
GDN_HD void chunk_prepare(const float* k, const float* v, const float* g, const float* beta,
                          float* gcum, float* W, float* U, int T, int H, int HV, int K, int V,
                          int C, int b, int hv, int n, int tid, int nt, Sync sync, float* scratch,
                          bool stage_k) {
  const int h = hv / (HV / H), t0 = n * C, L = imin(C, T - t0);
  float* A = scratch;
  float* gc = A + C * C;
  float* bt = gc + C;
  const float* kc = k + qk_index(b, t0, h, T, H, K);
  long kst = (long)H * K;
  if (stage_k) {
    float* Ks = bt + C;
    for (int i = tid; i < L * K; i += nt) Ks[i] = kc[(i / K) * kst + i % K];
    kc = Ks;
    kst = K;
  }
  if (tid == 0) {
    Acc acc = 0;
    for (int i = 0; i < L; ++i) {
      acc += (Acc)g[gate_index(b, t0 + i, hv, T, HV)];
      gc[i] = (float)acc;
      gcum[ws_row(b, hv, t0 + i, HV, T)] = (float)acc;
      bt[i] = beta[gate_index(b, t0 + i, hv, T, HV)];
    }
  }
  sync();
  for (int idx = tid; idx < L * L; idx += nt) {
    const int i = idx / L, j = idx % L;
    if (j < i) {
      Acc d = 0;
      for (int kk = 0; kk < K; ++kk) d += (Acc)kc[i * kst + kk] * (Acc)kc[j * kst + kk];
      A[i * C + j] = (float)((Acc)bt[i] * d * expo<Acc>((Acc)gc[i] - (Acc)gc[j]));
    }
  }
  sync();
  // forward substitution, one right-hand-side column per thread: no barrier inside
  for (int col = tid; col < K + V; col += nt) {
    const bool isw = col < K;
    float* out = isw ? W + ws_row(b, hv, t0, HV, T) * K + col
                     : U + ws_row(b, hv, t0, HV, T) * V + (col - K);
    const long ost = isw ? K : V;
    for (int i = 0; i < L; ++i) {
      Acc acc = isw ? (Acc)bt[i] * expo<Acc>((Acc)gc[i]) * (Acc)kc[i * kst + col]
                    : (Acc)bt[i] * (Acc)v[v_index(b, t0 + i, hv, T, HV, V) + col - K];
      for (int j = 0; j < i; ++j) acc -= (Acc)A[i * C + j] * (Acc)out[j * ost];
      out[i * ost] = (float)acc;
    }
  }
}

// Scratch floats of phase 2 for a tile of BV columns (stage_k: the chunk's keys are staged).
GDN_HD long state_pass_scratch_floats(int C, int K, int BV, bool stage_k) {
  return (long)K * BV + (long)C * BV + 2L * C + (stage_k ? (long)C * K : 0L);
}

template <typename Acc, typename Sync>
GDN_HD void chunk_state_pass(const float* q, const float* k, const float* gcum, const float* W,
                             float* U, float* o, float* state, int T, int H, int HV, int K, int V,
                             int C, int b, int hv, int c0, int BV, int tid, int nt, Sync sync,
                             float* scratch, bool stage_k) {
  const int h = hv / (HV / H), bv = imin(BV, V - c0);
  float* S = scratch;         // [K][BV] state tile
  float* Ud = S + K * BV;     // [C][BV] exp(gc_last - gc_j) U_j, the decayed writes
  float* dq = Ud + C * BV;    // [C] exp(gc_i)
  float* dk = dq + C;         // [C] exp(gc_last - gc_j)
  float* Ks = dk + C;         // [C][K] staged keys (stage_k)
  float* st = state + state_index(b, hv, HV, K, V);
  for (int i = tid; i < K * bv; i += nt) S[(i / bv) * BV + i % bv] = st[(long)(i / bv) * V + c0 + i % bv];
  for (int t0 = 0; t0 < T; t0 += C) {
    const int L = imin(C, T - t0);
    const float* Wc = W + ws_row(b, hv, t0, HV, T) * K;
    float* Uc = U + ws_row(b, hv, t0, HV, T) * V + c0;
    const float* gc = gcum + ws_row(b, hv, t0, HV, T);
    const float* kc = k + qk_index(b, t0, h, T, H, K);
    long kst = (long)H * K;
    sync();
    if (stage_k) {
      for (int i = tid; i < L * K; i += nt) Ks[i] = kc[(i / K) * kst + i % K];
      kc = Ks;
      kst = K;
    }
    for (int i = tid; i < L; i += nt) {
      dq[i] = (float)expo<Acc>((Acc)gc[i]);
      dk[i] = (float)expo<Acc>((Acc)gc[L - 1] - (Acc)gc[i]);
    }
    sync();
    for (int idx = tid; idx < L * bv; idx += nt) {
      const int i = idx / bv, c = idx % bv;
      const float* qi = q + qk_index(b, t0 + i, h, T, H, K);
      Acc ws = 0, qs = 0;
      for (int kk = 0; kk < K; ++kk) {
        const Acc s = (Acc)S[kk * BV + c];
        ws += (Acc)Wc[(long)i * K + kk] * s;
        qs += (Acc)qi[kk] * s;
      }
      const float un = (float)((Acc)Uc[(long)i * V + c] - ws);
      Uc[(long)i * V + c] = un;
      Ud[i * BV + c] = (float)((Acc)dk[i] * (Acc)un);
      o[v_index(b, t0 + i, hv, T, HV, V) + c0 + c] = (float)((Acc)dq[i] * qs);
    }
    sync();
    const Acc elast = (Acc)dq[L - 1];
    for (int idx = tid; idx < K * bv; idx += nt) {
      const int kk = idx / bv, c = idx % bv;
      Acc acc = elast * (Acc)S[kk * BV + c];
      for (int j = 0; j < L; ++j) acc += (Acc)kc[j * kst + kk] * (Acc)Ud[j * BV + c];
      S[kk * BV + c] = (float)acc;
    }
  }
  sync();
  for (int i = tid; i < K * bv; i += nt) st[(long)(i / bv) * V + c0 + i % bv] = S[(i / bv) * BV + i % bv];
}

template <typename Acc, typename Sync>
GDN_HD void chunk_output(const float* q, const float* k, const float* gcum, const float* U,
                         float* o, int T, int H, int HV, int K, int V, float scale, int C, int b,
                         int hv, int n, int tid, int nt, Sync sync, float* scratch, bool stage) {
  const int h = hv / (HV / H), t0 = n * C, L = imin(C, T - t0);
  float* P = scratch;
  float* gc = P + C * C;
  const float* qc = q + qk_index(b, t0, h, T, H, K);
  const float* kc = k + qk_index(b, t0, h, T, H, K);
  long st = (long)H * K;
  if (stage) {
    float* Qs = gc + C;
    float* Ks = Qs + C * K;
    for (int i = tid; i < L * K; i += nt) {
      Qs[i] = qc[(i / K) * st + i % K];
      Ks[i] = kc[(i / K) * st + i % K];
    }
    qc = Qs;
    kc = Ks;
    st = K;
  }
  for (int i = tid; i < L; i += nt) gc[i] = gcum[ws_row(b, hv, t0 + i, HV, T)];
  sync();
  for (int idx = tid; idx < L * L; idx += nt) {
    const int i = idx / L, j = idx % L;
    if (j <= i) {
      Acc d = 0;
      for (int kk = 0; kk < K; ++kk) d += (Acc)qc[i * st + kk] * (Acc)kc[j * st + kk];
      P[i * C + j] = (float)(d * expo<Acc>((Acc)gc[i] - (Acc)gc[j]));
    }
  }
  sync();
  const float* Uc = U + ws_row(b, hv, t0, HV, T) * V;
  for (int idx = tid; idx < L * V; idx += nt) {
    const int i = idx / V, c = idx % V;
    Acc acc = 0;
    for (int j = 0; j <= i; ++j) acc += (Acc)P[i * C + j] * (Acc)Uc[(long)j * V + c];
    float* out = o + v_index(b, t0 + i, hv, T, HV, V) + c;
    *out = (float)((Acc)scale * ((Acc)*out + acc));
  }
}

}  // namespace gdn
