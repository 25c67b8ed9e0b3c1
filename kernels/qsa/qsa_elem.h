// QSA element code shared by the CPU (g++) and CUDA (nvcc) builds: dtype loads, probability
// rounding, the split-partial epilogue and the base-2 LSE merge of one output element.
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#define WB_HD __host__ __device__ __forceinline__
#else
#define WB_HD inline
#endif

enum WbDtype { WB_FP32 = 0, WB_BF16 = 1, WB_FP16 = 2 };

WB_HD float wb_bits_to_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f; memcpy(&f, &u, 4); return f;
#endif
}

WB_HD uint32_t wb_f32_to_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u; memcpy(&u, &f, 4); return u;
#endif
}

WB_HD float wb_fp16_to_f32(uint16_t h) {
#if defined(__CUDA_ARCH__)
  __half_raw r; r.x = h; return __half2float(__half(r));
#else
  uint32_t s = (h >> 15) & 1, e = (h >> 10) & 31, m = h & 1023;
  float v = (e == 0) ? ldexpf((float)m, -24) : (e == 31 ? (m ? NAN : INFINITY) : ldexpf((float)(m | 1024), (int)e - 25));
  return s ? -v : v;
#endif
}

// value i of a buffer in dtype dt, as fp32 (exact)
WB_HD float wb_load(const void* p, int64_t i, int dt) {
  if (dt == WB_FP32) return ((const float*)p)[i];
  uint16_t h = ((const uint16_t*)p)[i];
  return dt == WB_BF16 ? wb_bits_to_f32((uint32_t)h << 16) : wb_fp16_to_f32(h);
}

// round an fp32 value once, to nearest even, to a format with `mant` fraction bits and smallest
// normal exponent `emin` (bf16: 7, -126; fp16: 10, -14); returned as the fp32 holding it.
WB_HD float wb_round(float x, int mant, int emin, float maxv) {
  uint32_t u = wb_f32_to_bits(x);
  uint32_t a = u & 0x7fffffffu;
  if (a >= 0x7f800000u || a == 0) return x;
  int e = (int)(a >> 23) - 127;
  float r;
  if (e < emin) {  // target subnormal: fixed quantum 2^(emin - mant)
    float q = ldexpf(1.0f, emin - mant);
    r = rintf(fabsf(x) / q) * q;
  } else {
    int drop = 23 - mant;
    uint32_t lsb = (a >> drop) & 1u;
    a += (1u << (drop - 1)) - 1u + lsb;
    a &= ~((1u << drop) - 1u);
    r = wb_bits_to_f32(a);
    if (r > maxv) r = INFINITY;
  }
  return (u >> 31) ? -r : r;
}

WB_HD float wb_round_to(float x, int dt) {
  if (dt == WB_BF16) return wb_round(x, 7, -126, 3.3895313892515355e38f);
  if (dt == WB_FP16) return wb_round(x, 10, -14, 65504.0f);
  return x;
}

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
