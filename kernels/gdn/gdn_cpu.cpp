// CPU build of the GDN kernels: the recurrence step by step and the chunked form, both from the
// element code in gdn_common.h. Called through ctypes by workbench/kernels/gdn/ext.py.
#include <algorithm>
#include <vector>

#include "common/wb_elem.h"
#include "gdn/gdn_abi.h"
#include "gdn/gdn_common.h"
#include "gdn/gdn_mma.h"

namespace {

// The L2-norm factor 1 / sqrt(sum x^2 + 1e-6) of a row of K values in dtype dt, summed in the
// order of the CUDA kernels (a warp: 32 lane-strided sums, then an xor butterfly; no fused
// multiply-adds, as both builds compile).
float l2_factor(const void* x, long at, int K, int dt) {
  float p[32], n[32];
  for (int l = 0; l < 32; ++l) {
    p[l] = 0.f;
    for (int i = l; i < K; i += 32) {
      const float e = wb_load(x, at + i, dt);
      p[l] += e * e;
    }
  }
  for (int off = 16; off > 0; off >>= 1) {
    for (int l = 0; l < 32; ++l) n[l] = p[l] + p[l ^ off];
    std::copy(n, n + 32, p);
  }
  return 1.f / sqrtf(p[0] + 1e-6f);
}

// The recurrence, step by step; the contract of gdn_recurrent_cuda (dtypes, h0 / zero_state,
// qk_l2norm, o_dtype), with sums in another order.
template <typename Acc>
void recurrent(const GdnArgs& a) {
  const int B = a.B, T = a.T, H = a.H, HV = a.HV, K = a.K, V = a.V;
  std::vector<Acc> kv(V), ov(V), u(V);
  std::vector<float> kt(K), qt(K);
  for (int b = 0; b < B; ++b)
    for (int hv = 0; hv < HV; ++hv) {
      const int h = hv / (HV / H);
      const long at = gdn::state_index(b, hv, HV, K, V);
      float* S = a.state + at;
      if (a.zero_state) std::fill(S, S + (long)K * V, 0.f);
      else if (a.h0) std::copy(a.h0 + at, a.h0 + at + (long)K * V, S);
      for (int t = 0; t < T; ++t) {
        const long qk = gdn::qk_index(b, t, h, T, H, K), vi = gdn::v_index(b, t, hv, T, HV, V);
        const float fq = a.qk_l2norm ? l2_factor(a.q, qk, K, a.in_dtype) : 1.f;
        const float fk = a.qk_l2norm ? l2_factor(a.k, qk, K, a.in_dtype) : 1.f;
        for (int i = 0; i < K; ++i) {
          kt[i] = wb_load(a.k, qk + i, a.in_dtype) * fk;
          qt[i] = wb_load(a.q, qk + i, a.in_dtype) * fq;
        }
        const long gi = gdn::gate_index(b, t, hv, T, HV);
        const Acc decay = gdn::expo<Acc>((Acc)wb_load(a.g, gi, a.g_dtype));
        const Acc bt = (Acc)wb_load(a.beta, gi, a.beta_dtype);
        for (int c = 0; c < V; ++c) kv[c] = 0, ov[c] = 0;
        for (int kk = 0; kk < K; ++kk)
          for (int c = 0; c < V; ++c) kv[c] += (Acc)S[kk * V + c] * (Acc)kt[kk];
        for (int c = 0; c < V; ++c)
          u[c] = gdn::delta_u<Acc>(bt, (Acc)wb_load(a.v, vi + c, a.in_dtype), decay, kv[c]);
        for (int kk = 0; kk < K; ++kk)
          for (int c = 0; c < V; ++c) {
            const float s = gdn::state_update<Acc>(S[kk * V + c], decay, kt[kk], u[c]);
            S[kk * V + c] = s;
            ov[c] += (Acc)s * (Acc)qt[kk];
          }
        for (int c = 0; c < V; ++c) wb_store(a.o, vi + c, (float)((Acc)a.scale * ov[c]), a.o_dtype);
      }
    }
}

template <typename Acc>
void chunked(const float* q, const float* k, const float* v, const float* g, const float* beta,
             float* o, float* state, float* gcum, float* W, float* U, int B, int T, int H, int HV,
             int K, int V, float scale, int C) {
  const int NC = (T + C - 1) / C;
  std::vector<float> scratch(std::max(gdn::prepare_scratch_floats(C, K, false),
                                      std::max(gdn::output_scratch_floats(C, K, false),
                                               gdn::state_pass_scratch_floats(C, K, V, false))));
  auto nosync = [] {};
  for (int b = 0; b < B; ++b)
    for (int hv = 0; hv < HV; ++hv) {
      for (int n = 0; n < NC; ++n)
        gdn::chunk_prepare<Acc>(k, v, g, beta, gcum, W, U, T, H, HV, K, V, C, b, hv, n, 0, 1,
                                nosync, scratch.data(), false);
      gdn::chunk_state_pass<Acc>(q, k, gcum, W, U, o, state, T, H, HV, K, V, C, b, hv, 0, V, 0, 1,
                                 nosync, scratch.data(), false);
      for (int n = 0; n < NC; ++n)
        gdn::chunk_output<Acc>(q, k, gcum, U, o, T, H, HV, K, V, scale, C, b, hv, n, 0, 1, nosync,
                               scratch.data(), false);
    }
}

}  // namespace

extern "C" {

// The contract of gdn_recurrent_cuda (see gdn_cuda.cu); returns WB_OK, or WB_ERR_ARGUMENT for
// a dtype code out of range.
int gdn_recurrent_cpu(const GdnArgs* a) {
  for (int dt : {a->in_dtype, a->g_dtype, a->beta_dtype, a->o_dtype})
    if (dt < WB_FP32 || dt > WB_FP16) return WB_ERR_ARGUMENT;
  if (a->acc64) recurrent<double>(*a);
  else recurrent<float>(*a);
  return WB_OK;
}

// gcum, W, U: float32 workspace provided by the caller (GdnArgs); returns WB_OK, or WB_ERR_SHAPE
// for a chunk < 1.
int gdn_chunked_cpu(const GdnArgs* a) {
  if (a->chunk < 1) return WB_ERR_SHAPE;
  const float *q = (const float*)a->q, *k = (const float*)a->k, *v = (const float*)a->v;
  float* o = (float*)a->o;
  if (a->acc64) chunked<double>(q, k, v, a->g, a->beta, o, a->state, a->gcum, a->W, a->U, a->B, a->T, a->H, a->HV,
                                a->K, a->V, a->scale, a->chunk);
  else chunked<float>(q, k, v, a->g, a->beta, o, a->state, a->gcum, a->W, a->U, a->B, a->T, a->H, a->HV, a->K,
                      a->V, a->scale, a->chunk);
  return WB_OK;
}

// The four 16 x 16 diagonal blocks of (I + A)^-1 for n strictly lower triangular 64 x 64
// matrices (row-major, contiguous; the rest of X is left as is): the code of the CUDA
// tensor-core path (gdn_mma.h), run here so tests can check it.
int gdn_inverse_diag16_cpu(const float* A, float* X, int n) {
  for (int b = 0; b < n; ++b)
    for (int c = 0; c < 64; ++c) {
      const int o = (c / 16) * 16, j = c % 16;
      float x[16];
      gdn::inverse_diag16_column(A + (long)b * 4096, 64, o, j, x);
      for (int i = 0; i < 16; ++i) X[(long)b * 4096 + (o + i) * 64 + o + j] = x[i];
    }
  return WB_OK;
}

}  // extern "C"

GDN_ARGS_LAYOUT
WB_DEFINE_STATUS_NAME
