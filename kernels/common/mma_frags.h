// The fragments of one m16n8 mma.sync per the PTX ISA's tables, built from row-major matrices:
// shared by cuda_emu_selftest.cpp (the host emulation's models, on the CPU) and mma_probe.cu (the
// tensor cores), so that both sides of tests/kernels/test_cuda_emu.py take the same registers.
// g = lane / 4, t = lane % 4. Include after cuda_emu.h on the host (its __device__ and bit casts).
#pragma once
#include <cstdint>

namespace wbfrag {

// this lane's accumulator fragment of a 16 x 8 C: c0 (g, 2t), c1 (g, 2t + 1), c2 (g + 8, 2t),
// c3 (g + 8, 2t + 1); and its store into D
__device__ inline void c_frag(const float* C, float (&d)[4], int lane) {
  const int g = lane / 4, t = lane % 4;
  for (int e = 0; e < 4; ++e) d[e] = C[(g + 8 * (e / 2)) * 8 + 2 * t + e % 2];
}
__device__ inline void d_store(float* D, const float (&d)[4], int lane) {
  const int g = lane / 4, t = lane % 4;
  for (int e = 0; e < 4; ++e) D[(g + 8 * (e / 2)) * 8 + 2 * t + e % 2] = d[e];
}

// m16n8k8 .tf32: A 16 x 8, B 8 x 8 (float32 bit patterns): a0 (g, t), a1 (g + 8, t), a2 (g, t + 4),
// a3 (g + 8, t + 4); b0 (k t, n g), b1 (k t + 4, n g)
__device__ inline void ab_k8(const float* A, const float* B, int lane, uint32_t (&a)[4], uint32_t& b0,
                             uint32_t& b1) {
  const int g = lane / 4, t = lane % 4;
  a[0] = __float_as_uint(A[g * 8 + t]);
  a[1] = __float_as_uint(A[(g + 8) * 8 + t]);
  a[2] = __float_as_uint(A[g * 8 + t + 4]);
  a[3] = __float_as_uint(A[(g + 8) * 8 + t + 4]);
  b0 = __float_as_uint(B[t * 8 + g]);
  b1 = __float_as_uint(B[(t + 4) * 8 + g]);
}

// m16n8k16 .bf16: A 16 x 16, B 16 x 8 (bf16 bits), two values a register, the lower k or column
// in the low half: a0 (g, 2t..), a1 (g + 8, 2t..), a2 (g, 2t + 8..), a3 (g + 8, 2t + 8..);
// b0 (k 2t..2t+1, n g), b1 (k 2t + 8..2t + 9, n g)
__device__ inline void ab_k16(const uint16_t* A, const uint16_t* B, int lane, uint32_t (&a)[4],
                              uint32_t& b0, uint32_t& b1) {
  const int g = lane / 4, t = lane % 4;
  auto pair = [](uint16_t lo, uint16_t hi) { return (uint32_t)lo | ((uint32_t)hi << 16); };
  auto a_at = [&](int row, int col) { return pair(A[row * 16 + col], A[row * 16 + col + 1]); };
  a[0] = a_at(g, 2 * t);
  a[1] = a_at(g + 8, 2 * t);
  a[2] = a_at(g, 2 * t + 8);
  a[3] = a_at(g + 8, 2 * t + 8);
  b0 = pair(B[(2 * t) * 8 + g], B[(2 * t + 1) * 8 + g]);
  b1 = pair(B[(2 * t + 8) * 8 + g], B[(2 * t + 9) * 8 + g]);
}

}  // namespace wbfrag
