// QSA element code shared by the CPU (g++) and CUDA (nvcc) builds: the base-2 LSE merge of one
// output element and the slot of a listed token (dtype loads and rounding: common/wb_elem.h).
#pragma once
#include "common/wb_elem.h"

// base-2 LSE merge of element d of one row: o = sum_s w_s o_s / sum_s w_s, w_s = 2^(lse_s - max)
// (sequential over s); returns the merged lse through *lse_out. Empty parts (-inf) add nothing.
WB_HD float wb_merge_elem(const float* o_parts, const float* lse_parts, int S, int D, int d, float* lse_out) {
  float m = -INFINITY;
  for (int s = 0; s < S; ++s) m = fmaxf(m, lse_parts[s]);
  if (m == -INFINITY) { *lse_out = -INFINITY; return 0.0f; }
  float sw = 0.0f, acc = 0.0f;
  for (int s = 0; s < S; ++s) {
    float w = exp2f(lse_parts[s] - m);
    sw = sw + w;
    acc = acc + w * o_parts[(int64_t)s * D + d];
  }
  *lse_out = m + log2f(sw);
  return acc / sw;
}

// slot of listed token t of row b: mode 0 reads logical indices through the block table,
// mode 1 reads physical slots directly (pre-sorted for the physical page order)
WB_HD int64_t wb_slot(const int32_t* idx, const int32_t* bt, int mode, int b, int t, int L, int max_pages, int ps) {
  int32_t i = idx[(int64_t)b * L + t];
  if (i < 0) return -1;
  if (mode == 1) return i;
  return (int64_t)bt[(int64_t)b * max_pages + i / ps] * ps + i % ps;
}
