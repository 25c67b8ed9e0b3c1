// CPU build of the QSA split-KV decode: one (b, kv head, split) at a time, every sum sequential.
#include <vector>
#include "qsa/qsa_elem.h"

extern "C" void qsa_split_partials_cpu(const void* q, const void* k, const void* v, const int32_t* idx,
                                        const int32_t* bt, int mode, int B, int HQ, int HKV, int D, int ps,
                                        int max_pages, int L, int S, int P, float qscale, int dt, int prob_dt,
                                        float* o_parts, float* lse_parts) {
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
}

extern "C" void qsa_merge_cpu(const float* o_parts, const float* lse_parts, int rows, int S, int D, float* o,
                               float* lse) {
  for (int r = 0; r < rows; ++r)
    for (int d = 0; d < D; ++d) {
      float l;
      o[(int64_t)r * D + d] = wb_merge_elem(o_parts + (int64_t)r * S * D, lse_parts + (int64_t)r * S, S, D, d, &l);
      if (d == 0) lse[r] = l;
    }
}

// The element rounding every native kernel shares (wb_round_to), exposed so that tests can hold
// it bit for bit against an independent round-to-nearest-even (torch's casts).
extern "C" void wb_round_array_cpu(const float* x, int64_t n, int dt, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = wb_round_to(x[i], dt);
}
