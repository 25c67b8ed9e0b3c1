// CPU build of the GDN kernels: the recurrence step by step and the chunked form, both from the
// element code in gdn_common.h. Called through ctypes by workbench/kernels/gdn/ext.py.
#include <algorithm>
#include <vector>

#include "gdn/gdn_abi.h"
#include "gdn/gdn_common.h"
#include "gdn/gdn_mma.h"

namespace {

template <typename Acc>
void recurrent(const float* q, const float* k, const float* v, const float* g, const float* beta,
               float* o, float* state, int B, int T, int H, int HV, int K, int V, float scale) {
  std::vector<Acc> kv(V), ov(V), u(V);
  for (int b = 0; b < B; ++b)
    for (int hv = 0; hv < HV; ++hv) {
      const int h = hv / (HV / H);
      float* S = state + gdn::state_index(b, hv, HV, K, V);
      for (int t = 0; t < T; ++t) {
        const float* kt = k + gdn::qk_index(b, t, h, T, H, K);
        const float* qt = q + gdn::qk_index(b, t, h, T, H, K);
        const float* vt = v + gdn::v_index(b, t, hv, T, HV, V);
        const Acc decay = gdn::expo<Acc>((Acc)g[gdn::gate_index(b, t, hv, T, HV)]);
        const Acc bt = (Acc)beta[gdn::gate_index(b, t, hv, T, HV)];
        for (int c = 0; c < V; ++c) kv[c] = 0, ov[c] = 0;
        for (int kk = 0; kk < K; ++kk)
          for (int c = 0; c < V; ++c) kv[c] += (Acc)S[kk * V + c] * (Acc)kt[kk];
        for (int c = 0; c < V; ++c) u[c] = gdn::delta_u<Acc>(bt, (Acc)vt[c], decay, kv[c]);
        for (int kk = 0; kk < K; ++kk)
          for (int c = 0; c < V; ++c) {
            const float s = gdn::state_update<Acc>(S[kk * V + c], decay, kt[kk], u[c]);
            S[kk * V + c] = s;
            ov[c] += (Acc)s * (Acc)qt[kk];
          }
        float* ot = o + gdn::v_index(b, t, hv, T, HV, V);
        for (int c = 0; c < V; ++c) ot[c] = (float)((Acc)scale * ov[c]);
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

// q, k, v, o float32 (GdnArgs); returns WB_OK.
int gdn_recurrent_cpu(const GdnArgs* a) {
  const float *q = (const float*)a->q, *k = (const float*)a->k, *v = (const float*)a->v;
  float* o = (float*)a->o;
  if (a->acc64) recurrent<double>(q, k, v, a->g, a->beta, o, a->state, a->B, a->T, a->H, a->HV, a->K, a->V, a->scale);
  else recurrent<float>(q, k, v, a->g, a->beta, o, a->state, a->B, a->T, a->H, a->HV, a->K, a->V, a->scale);
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
