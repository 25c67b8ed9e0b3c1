// Element code shared by every native kernel family, CPU (g++) and CUDA (nvcc) builds alike:
// exact loads of fp32 / bf16 / fp16 buffers as fp32, and the one
// round-to-nearest-even of an fp32 value to bf16 / fp16 (returned as the fp32 holding it).
// Its numba twin is workbench/kernels/_numba_elem.py.
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common/wb_abi.h"

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#define WB_HD __host__ __device__ __forceinline__
#else
#define WB_HD inline
#endif

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

// fp16 bits of an fp32 value already representable in fp16 (wb_round_to(x, WB_FP16)), inf, NaN.
WB_HD uint16_t wb_fp16_bits(float r) {
  const uint32_t u = wb_f32_to_bits(r), a = u & 0x7fffffffu;
  const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  if (a > 0x7f800000u) return sign | 0x7e00u;
  if (a == 0x7f800000u) return sign | 0x7c00u;
  if (a == 0) return sign;
  const int e = (int)(a >> 23) - 127;
  if (e < -14) return sign | (uint16_t)(fabsf(r) * 16777216.0f);  // subnormal: r = m 2^-24, exact
  return sign | (uint16_t)(((e + 15) << 10) | ((a >> 13) & 0x3ffu));
}

// store fp32 x as value i of a buffer in dtype dt, rounded once to nearest even
WB_HD void wb_store(void* p, int64_t i, float x, int dt) {
  if (dt == WB_FP32) { ((float*)p)[i] = x; return; }
  const float r = wb_round_to(x, dt);
  ((uint16_t*)p)[i] = dt == WB_BF16 ? (uint16_t)(wb_f32_to_bits(r) >> 16) : wb_fp16_bits(r);
}
