// Split-K GEMM element code shared by the CPU and CUDA builds: slice bounds and the reduction of
// one output element's partials (dtype loads and rounding come from common/wb_elem.h).
#pragma once
#include "common/wb_elem.h"

WB_HD int wb_slice_len(int K, int S) { return (K + S - 1) / S; }

// sum of the S partials of one element (stride `stride` apart), in fp32: order 0 sequential
// ((p0 + p1) + p2) + ..., order 1 pairwise tree (an odd last term is carried up a level)
WB_HD float wb_reduce_partials(const float* p, int S, int64_t stride, int order) {
  if (order == 0) {
    float acc = p[0];
    for (int s = 1; s < S; ++s) acc = acc + p[(int64_t)s * stride];
    return acc;
  }
  float buf[64];
  int n = S;
  for (int s = 0; s < S; ++s) buf[s] = p[(int64_t)s * stride];
  while (n > 1) {
    int h = 0;
    for (int i = 0; i + 1 < n; i += 2) buf[h++] = buf[i] + buf[i + 1];
    if (n % 2) buf[h++] = buf[n - 1];
    n = h;
  }
  return buf[0];
}
