// CPU build of the QSA split-KV decode: one (b, kv head, split) at a time, every sum sequential.
#include <vector>
#include "qsa/qsa_abi.h"
#include "qsa/qsa_elem.h"

// QsaDecodeArgs -> o_parts, lse_parts. Returns WB_OK or WB_ERR_SHAPE (HQ not a multiple of HKV).
extern "C" int qsa_split_partials_cpu(const QsaDecodeArgs* a) {
  const void *q = a->q, *k = a->k, *v = a->v;
  const int32_t *idx = a->idx, *bt = a->bt;
  const int mode = a->mode, B = a->B, HQ = a->HQ, HKV = a->HKV, D = a->D, ps = a->ps, max_pages = a->max_pages;
  const int L = a->L, S = a->S, P = a->P, dt = a->dt, prob_dt = a->prob_dt;
  const float qscale = a->qscale;
  float *o_parts = a->o_parts, *lse_parts = a->lse_parts;
  if (HKV < 1 || HQ % HKV || S < 1 || P < 1) return WB_ERR_SHAPE;
  const int G = HQ / HKV;
  std::vector<float> sc(P), pr(P), qf(D);
  std::vector<int64_t> slot(P);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < HQ; ++h) {
      const int hk = h / G;
      for (int d = 0; d < D; ++d) qf[d] = wb_load(q, ((int64_t)b * HQ + h) * D + d, dt);
      for (int s = 0; s < S; ++s) {
        float m = -INFINITY;
        for (int t = 0; t < P; ++t) {
          int tt = s * P + t;
          slot[t] = tt < L ? wb_slot(idx, bt, mode, b, tt, L, max_pages, ps) : -1;
          float acc = -INFINITY;
          if (slot[t] >= 0) {
            acc = 0.0f;
            const int64_t base = (slot[t] * HKV + hk) * D;
            for (int d = 0; d < D; ++d) acc = acc + qf[d] * wb_load(k, base + d, dt);
            acc = acc * qscale;
          }
          sc[t] = acc;
          m = fmaxf(m, acc);
        }
        const int64_t row = ((int64_t)b * HQ + h) * S + s;
        float l = 0.0f;
        if (m != -INFINITY)
          for (int t = 0; t < P; ++t) {
            float p = slot[t] >= 0 ? exp2f(sc[t] - m) : 0.0f;
            l = l + p;
            pr[t] = wb_round_to(p, prob_dt);
          }
        for (int d = 0; d < D; ++d) {
          float acc = 0.0f;
          if (l > 0.0f) {
            for (int t = 0; t < P; ++t)
              if (slot[t] >= 0) acc = acc + pr[t] * wb_load(v, (slot[t] * HKV + hk) * D + d, dt);
            acc = acc / l;
          }
          o_parts[row * D + d] = acc;
        }
        lse_parts[row] = l > 0.0f ? m + log2f(l) : -INFINITY;
      }
    }
  return WB_OK;
}

// QsaMergeArgs -> o, lse. Returns WB_OK.
extern "C" int qsa_merge_cpu(const QsaMergeArgs* a) {
  const int S = a->S, D = a->D;
  for (int r = 0; r < a->rows; ++r)
    for (int d = 0; d < D; ++d) {
      float l;
      a->o[(int64_t)r * D + d] = wb_merge_elem(a->o_parts + (int64_t)r * S * D, a->lse_parts + (int64_t)r * S, S, D,
                                               d, &l);
      if (d == 0) a->lse[r] = l;
    }
  return WB_OK;
}

// The element rounding every native kernel shares (wb_round_to), exposed so that tests can hold
// it bit for bit against an independent round-to-nearest-even (torch's casts).
extern "C" void wb_round_array_cpu(const float* x, int64_t n, int dt, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = wb_round_to(x[i], dt);
}

QSA_ARGS_LAYOUT
WB_DEFINE_STATUS_NAME
