// Host/device helper of the tensor-core chunked path (gdn_mma.cu), kept in a header so that the
// CPU build runs the same code (gdn_cpu.cpp exports it; a test checks it against an fp64
// inverse): one column of (I + A_oo)^-1 for a 16 x 16 diagonal block of a strictly lower
// triangular A, by forward substitution held in registers, in float32 with fused multiply-adds
// (fmaf: the same result on the host and the device).
#pragma once

#include <math.h>

#include "gdn/gdn_common.h"

#if defined(__CUDACC__)
#define GDN_UNROLL _Pragma("unroll")
#else
#define GDN_UNROLL
#endif

namespace gdn {

// x = column j of (I + A[o:o+16, o:o+16])^-1 (A row stride ld): x_i = [i == j] - sum_{m<i} A_im x_m.
// x_m = 0 for m < j, so the rows above j come out 0 and the diagonal 1.
GDN_HD void inverse_diag16_column(const float* A, int ld, int o, int j, float (&x)[16]) {
  GDN_UNROLL
  for (int i = 0; i < 16; ++i) {
    const float* ar = A + (o + i) * ld + o;
    float s0 = 0.f, s1 = 0.f;
    GDN_UNROLL
    for (int m = 0; m + 1 < i; m += 2) {
      s0 = fmaf(ar[m], x[m], s0);
      s1 = fmaf(ar[m + 1], x[m + 1], s1);
    }
    if (i & 1) s0 = fmaf(ar[i - 1], x[i - 1], s0);
    x[i] = (i == j ? 1.f : 0.f) - (s0 + s1);
  }
}

}  // namespace gdn
