// Host/device helper of the tensor-core chunked path (gdn_mma.cu), kept in a header so that the
// CPU build runs the same code (gdn_cpu.cpp exports it; tests check it against an fp64 inverse):
// X = (I + A)^-1 for a strictly lower triangular 64 x 64 A, in 16 x 16 blocks, in float32.
#pragma once

#include <string.h>

#include "gdn/gdn_common.h"

#if defined(__CUDACC__)
#define GDN_UNROLL _Pragma("unroll")
#else
#define GDN_UNROLL
#endif

namespace gdn {

// four consecutive floats (16-byte aligned on the device)
GDN_HD void load4(const float* p, float (&o)[4]) {
#if defined(__CUDA_ARCH__)
  const float4 v = *reinterpret_cast<const float4*>(p);
  o[0] = v.x; o[1] = v.y; o[2] = v.z; o[3] = v.w;
#else
  memcpy(o, p, sizeof o);
#endif
}

GDN_HD void store4(float* p, float a, float b, float c, float d) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<float4*>(p) = make_float4(a, b, c, d);
#else
  p[0] = a; p[1] = b; p[2] = c; p[3] = d;
#endif
}

// A and X row stride ld (a multiple of 4, X 16-byte aligned); Tm: 3 * 256 floats of scratch.
// Run cooperatively by nt threads (tid) that call sync() between steps (gdn_common.h's pattern);
// returns after a final sync().
//   1. diagonal blocks X_II = (I + A_II)^-1, one column per item (64 items), by forward
//      substitution held in registers: x_i = [i == j] - sum_{m < i} A_im x_m;
//   2. by block distance d = 1, 2, 3, items of one row and 4 columns:
//      T = sum_{J <= M < I} A_IM X_MJ, then X_IJ = -X_II T (I = J + d).
template <typename Sync>
GDN_HD void invert_unit_lower64(const float* A, float* X, float* Tm, int ld, int tid, int nt,
                                Sync sync) {
  for (int c = tid; c < 64; c += nt) {
    const int o = (c / 16) * 16, j = c % 16;
    float x[16];
    GDN_UNROLL
    for (int i = 0; i < 16; ++i) {
      const float* ar = A + (o + i) * ld + o;
      float s0 = 0.f, s1 = 0.f;
      GDN_UNROLL
      for (int m = 0; m + 1 < i; m += 2) {
        s0 += ar[m] * x[m];
        s1 += ar[m + 1] * x[m + 1];
      }
      if (i & 1) s0 += ar[i - 1] * x[i - 1];
      x[i] = (i == j ? 1.f : 0.f) - (s0 + s1);  // x_m = 0 for m < j, so rows above j stay 0
    }
    GDN_UNROLL
    for (int i = 0; i < 16; ++i) X[(o + i) * ld + o + j] = x[i];
  }
  for (int idx = tid; idx < 64 * 16; idx += nt) {  // blocks above the diagonal, 4 floats a piece
    const int i = idx / 16, j = (idx % 16) * 4;
    if (j / 16 > i / 16) store4(X + i * ld + j, 0.f, 0.f, 0.f, 0.f);
  }
  sync();
  for (int d = 1; d < 4; ++d) {
    const int items = (4 - d) * 64;
    for (int it = tid; it < items; it += nt) {
      const int J = it / 64, r = (it / 4) % 16, c4 = (it % 4) * 4, I = J + d;
      const float* ar = A + (I * 16 + r) * ld;
      float s[4] = {0.f, 0.f, 0.f, 0.f};
      for (int m = J * 16; m < I * 16; ++m) {
        float xm[4];
        load4(X + m * ld + J * 16 + c4, xm);
        const float a = ar[m];
        s[0] += a * xm[0]; s[1] += a * xm[1]; s[2] += a * xm[2]; s[3] += a * xm[3];
      }
      store4(Tm + J * 256 + r * 16 + c4, s[0], s[1], s[2], s[3]);
    }
    sync();
    for (int it = tid; it < items; it += nt) {
      const int J = it / 64, r = (it / 4) % 16, c4 = (it % 4) * 4, I = J + d;
      const float* xr = X + (I * 16 + r) * ld + I * 16;
      float s[4] = {0.f, 0.f, 0.f, 0.f};
      GDN_UNROLL
      for (int m = 0; m < 16; ++m) {
        float tm[4];
        load4(Tm + J * 256 + m * 16 + c4, tm);
        const float a = xr[m];
        s[0] += a * tm[0]; s[1] += a * tm[1]; s[2] += a * tm[2]; s[3] += a * tm[3];
      }
      store4(X + (I * 16 + r) * ld + J * 16 + c4, -s[0], -s[1], -s[2], -s[3]);
    }
    sync();
  }
}

}  // namespace gdn
