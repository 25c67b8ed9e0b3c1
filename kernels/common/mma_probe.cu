// The tensor cores' own mma.sync m16n8k8 tf32 and m16n8k16 bf16 on given matrices, for the GPU
// test that checks the host emulation's models of them (common/cuda_emu.h; CPU side:
// cuda_emu_selftest.cpp, which builds the same fragments from the same PTX ISA tables):
// tests/kernels/test_cuda_emu.py. One warp a problem, row-major matrices in device memory.
#include <cstdint>
#include <cuda_runtime.h>

namespace {

__device__ void c_frag(const float* C, float (&d)[4], int lane) {
  const int g = lane / 4, t = lane % 4;
  for (int e = 0; e < 4; ++e) d[e] = C[(g + 8 * (e / 2)) * 8 + 2 * t + e % 2];
}
__device__ void d_store(float* D, const float (&d)[4], int lane) {
  const int g = lane / 4, t = lane % 4;
  for (int e = 0; e < 4; ++e) D[(g + 8 * (e / 2)) * 8 + 2 * t + e % 2] = d[e];
}

// problem p: D_p (16 x 8) = A_p (16 x 8) B_p (8 x 8) + C_p, A and B float32 bit patterns as given
// (the tensor cores read their tf32 part)
__global__ void mma8_kernel(const float* A, const float* B, const float* C, float* D) {
  const int p = blockIdx.x, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  A += p * 128, B += p * 64, C += p * 128, D += p * 128;
  const uint32_t a[4] = {__float_as_uint(A[g * 8 + t]), __float_as_uint(A[(g + 8) * 8 + t]),
                         __float_as_uint(A[g * 8 + t + 4]), __float_as_uint(A[(g + 8) * 8 + t + 4])};
  const uint32_t b0 = __float_as_uint(B[t * 8 + g]), b1 = __float_as_uint(B[(t + 4) * 8 + g]);
  float d[4];
  c_frag(C, d, lane);
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  d_store(D, d, lane);
}

// problem p: D_p (16 x 8) = A_p (16 x 16) B_p (16 x 8) + C_p, A and B as bf16 bits
__global__ void mma16_kernel(const uint16_t* A, const uint16_t* B, const float* C, float* D) {
  const int p = blockIdx.x, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  A += p * 256, B += p * 128, C += p * 128, D += p * 128;
  auto pair = [](uint16_t lo, uint16_t hi) { return (uint32_t)lo | ((uint32_t)hi << 16); };
  auto a_at = [&](int row, int col) { return pair(A[row * 16 + col], A[row * 16 + col + 1]); };
  const uint32_t a[4] = {a_at(g, 2 * t), a_at(g + 8, 2 * t), a_at(g, 2 * t + 8), a_at(g + 8, 2 * t + 8)};
  const uint32_t b0 = pair(B[(2 * t) * 8 + g], B[(2 * t + 1) * 8 + g]);
  const uint32_t b1 = pair(B[(2 * t + 8) * 8 + g], B[(2 * t + 9) * 8 + g]);
  float d[4];
  c_frag(C, d, lane);
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  d_store(D, d, lane);
}

}  // namespace

extern "C" {

// n problems of mma8_kernel / mma16_kernel on device pointers; a CUDA status
int probe_mma8(const float* A, const float* B, const float* C, float* D, int n) {
  mma8_kernel<<<n, 32>>>(A, B, C, D);
  const cudaError_t e = cudaGetLastError();
  return e != cudaSuccess ? (int)e : (int)cudaDeviceSynchronize();
}
int probe_mma16(const uint16_t* A, const uint16_t* B, const float* C, float* D, int n) {
  mma16_kernel<<<n, 32>>>(A, B, C, D);
  const cudaError_t e = cudaGetLastError();
  return e != cudaSuccess ? (int)e : (int)cudaDeviceSynchronize();
}

}  // extern "C"
