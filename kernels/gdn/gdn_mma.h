// Host/device helper of the tensor-core chunked path (gdn_mma.cu), kept in a header so that a CPU
// build can check it: X = (I + A)^-1 for a strictly lower triangular 64 x 64 A, in 16 x 16 blocks.
#pragma once

#include "gdn/gdn_common.h"

namespace gdn {

// A and X row stride ld; Tm: 3 * 256 floats of scratch. Run cooperatively by nt threads (tid)
// that call sync() between steps (the pattern of gdn_common.h).
//   1. diagonal blocks X_II = (I + A_II)^-1 by forward substitution, one column per thread;
//   2. by block distance d = 1, 2, 3: X_IJ = -X_II sum_{J <= M < I} A_IM X_MJ (I = J + d).
template <typename Sync>
GDN_HD void invert_unit_lower64(const float* A, float* X, float* Tm, int ld, int tid, int nt,
                                Sync sync) {
  for (int c = tid; c < 64; c += nt) {
    const int o = (c / 16) * 16, j = c % 16;
    for (int i = 0; i <= j; ++i) X[(o + i) * ld + o + j] = i == j ? 1.f : 0.f;
    for (int i = j + 1; i < 16; ++i) {
      const float* ar = A + (o + i) * ld + o;
      float s0 = 0.f, s1 = 0.f;
      int m = j;
      for (; m + 1 < i; m += 2) {
        s0 += ar[m] * X[(o + m) * ld + o + j];
        s1 += ar[m + 1] * X[(o + m + 1) * ld + o + j];
      }
      if (m < i) s0 += ar[m] * X[(o + m) * ld + o + j];
      X[(o + i) * ld + o + j] = -(s0 + s1);
    }
  }
  for (int idx = tid; idx < 64 * 64; idx += nt) {
    const int i = idx / 64, j = idx % 64;
    if (j / 16 > i / 16) X[i * ld + j] = 0.f;
  }
  sync();
  for (int d = 1; d < 4; ++d) {
    const int nb = 4 - d;
    for (int idx = tid; idx < nb * 256; idx += nt) {
      const int J = idx / 256, r = (idx / 16) % 16, c = idx % 16, I = J + d;
      const float* ar = A + (I * 16 + r) * ld;
      float s0 = 0.f, s1 = 0.f;
      for (int m = J * 16; m < I * 16; m += 2) {
        s0 += ar[m] * X[m * ld + J * 16 + c];
        s1 += ar[m + 1] * X[(m + 1) * ld + J * 16 + c];
      }
      Tm[idx] = s0 + s1;
    }
    sync();
    for (int idx = tid; idx < nb * 256; idx += nt) {
      const int J = idx / 256, r = (idx / 16) % 16, c = idx % 16, I = J + d;
      const float* xr = X + (I * 16 + r) * ld + I * 16;
      float s0 = 0.f, s1 = 0.f;
      for (int m = 0; m < 16; m += 2) {
        s0 += xr[m] * Tm[J * 256 + m * 16 + c];
        s1 += xr[m + 1] * Tm[J * 256 + (m + 1) * 16 + c];
      }
      X[(I * 16 + r) * ld + J * 16 + c] = -(s0 + s1);
    }
    sync();
  }
}

}  // namespace gdn
