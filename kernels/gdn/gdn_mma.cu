// Tensor-core chunked prefill of GDN (the CUDA build's "mma" path, for bf16/fp16 inputs).
//
// Same chunked UT/WY algebra as gdn_common.h (chunk C = 64, gc the within-chunk cumulative log
// decay, A[i][j] = beta_i (k_i . k_j) exp(gc_i - gc_j) for j < i), in three launches whose
// matrix products run on tensor cores: mma.sync m16n8k8 with tf32 operands and fp32
// accumulators. Every operand is the float32 value rounded once to nearest tf32 (cvt.rna, 10-bit
// mantissa): raw keys and queries when they are read (in place in shared memory, or at the
// fragment load), and the kernels' own products (A, the inverse diagonal blocks, the
// substitution's intermediates, W, the delta-rule values U, the per-chunk states, P) when they
// are written. tf32 keeps that rounding
// (2^-11 relative) well below the bf16 rounding of the inputs (2^-8); sums, decays, the state
// itself and U - W S stay in float32.
//   1. prepare, one block per (b, hv, chunk): A by mma; the 16 x 16 diagonal blocks of
//      (I + A)^-1 in float32 (gdn_mma.h); W = (I + A)^-1 (beta exp(gc) K) and
//      U = (I + A)^-1 (beta V) by blocked forward substitution with mma, a warp per 32 columns.
//   2. state pass, one block of 8 warps per (b, hv, 32 value columns), sequential over chunks: the
//      state tile lives in mma accumulators; per chunk U <- U - W S, the inter-chunk part of the
//      output O1 = exp(gc_i) q_i S (from the same rounded S, for phase 3), and
//      S <- exp(gc_last) S + K^T (exp(gc_last - gc_j) U_j); the next chunk's W, K, U tile, decays
//      and queries are copied into shared memory (cp.async) while this one computes.
//   3. output, one block per (b, hv, chunk), two per SM: o = scale (O1_i + sum_{j<=i} P_ij U_j)
//      with P = (Q K^T) * exp(gc_i - gc_j) by mma, written over Q and K in shared memory.
// All kernels are templated on K (and V) so that tile strides and loop bounds are constants:
// fragment addresses are then a base register plus immediates. Within each k-step of 8, slot t
// of the fragments holds k = 2t and slot t + 4 holds k = 2t + 1 (any pairing of k with slots
// gives the same product), so operands stored with k contiguous load as 8-byte pairs; tile row
// strides are 8 mod 32 floats for those and 4 mod 16 for operands read across k rows, which
// keeps the loads free of bank conflicts (bf16 / fp16 tiles: strides 8 mod 64 elements, pairs
// loaded as 4 bytes).
// q, k, v are read as float32 or, as the caller gave them, bf16 / fp16 (each kernel is templated
// on that type, QT): a 16-bit value is exact in tf32, so the result is the same bit for bit as
// with the values widened to float32 first, for half the bytes of q and k in the state pass and
// the output (and of k, v in prepare, which widens them in shared memory).
// qk_l2norm: a fourth launch computes each q and k row's factor 1 / sqrt(sum x^2 + 1e-6) (nq,
// nk), and the kernels fold them into the products they form from the raw q and k (A, the
// right-hand sides of W, O1, the state update's keys, P), so q and k keep their 16-bit reads;
// without a norm the factors are 1 and every product is unchanged bit for bit.
// Workspace (float32): gcum [B,HV,T], W [B,HV,T,K], U [B,HV,T,V], O1 [B,HV,T,V]. o is written
// in float32, bf16 or fp16 (rounded to nearest even from the float32 result).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <type_traits>

#include "gdn/gdn_abi.h"
#include "gdn/gdn_common.h"
#include "gdn/gdn_mma.h"

namespace {

constexpr int kC = 64;         // chunk length
constexpr int kPS = kC + 8;    // row stride of the C x C tiles (A, X, P)
constexpr int kThreads = 256;  // every kernel: 8 warps

__device__ __forceinline__ uint32_t tf32_bits(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r & 0xffffe000u;
}
// x rounded to nearest tf32 (ties away from zero), as a float
__device__ __forceinline__ float rtf32(float x) { return __uint_as_float(tf32_bits(x)); }

template <bool CVT>
__device__ __forceinline__ uint32_t opnd(float x) {
  if constexpr (CVT) {
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
  } else {
    return __float_as_uint(x);
  }
}

// Elements of the staged inputs q, k, v: float32, or bf16 / fp16 as the caller gave them (exact
// in tf32: nothing to round at the fragment loads). Scalar and pair reads, widened to float.
__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float2 ld2(const float* p) {
  return *reinterpret_cast<const float2*>(p);
}
__device__ __forceinline__ float2 ld2(const __nv_bfloat16* p) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
}
__device__ __forceinline__ float2 ld2(const __half* p) {
  return __half22float2(*reinterpret_cast<const __half2*>(p));
}
template <typename T>
constexpr bool is_f32 = std::is_same<T, float>::value;

__device__ __forceinline__ void mma8(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                     uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// One k-step of 8 for one warp. A and B are already offset to this lane's fragment elements and
// to the k-step; (i, k) of A at A[i * AI + k * AK], (k, n) of B at B[k * BK + n * BN]; slot t
// holds k = 2t, slot t + 4 holds k = 2t + 1 (pair loads where AK or BK is 1). CA/CB: round a
// float32 operand to tf32 here (raw float32 in shared memory) rather than rely on it being
// rounded; bf16 / fp16 operands are exact in tf32.
template <int MT, int NT, int AI, int AK, int BK, int BN, bool CA, bool CB, typename TA,
          typename TB>
__device__ __forceinline__ void kstep(float (&acc)[MT][NT][4], const TA* A, const TB* B) {
  constexpr bool ca = CA && is_f32<TA>, cb = CB && is_f32<TB>;
  uint32_t a[MT][4];
#pragma unroll
  for (int m = 0; m < MT; ++m) {
    const TA* p = A + m * 16 * AI;
    if constexpr (AK == 1) {
      const float2 lo = ld2(p);
      const float2 hi = ld2(p + 8 * AI);
      a[m][0] = opnd<ca>(lo.x);
      a[m][2] = opnd<ca>(lo.y);
      a[m][1] = opnd<ca>(hi.x);
      a[m][3] = opnd<ca>(hi.y);
    } else {
      a[m][0] = opnd<ca>(to_f(p[0]));
      a[m][2] = opnd<ca>(to_f(p[AK]));
      a[m][1] = opnd<ca>(to_f(p[8 * AI]));
      a[m][3] = opnd<ca>(to_f(p[8 * AI + AK]));
    }
  }
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    const TB* p = B + n * 8 * BN;
    uint32_t b0, b1;
    if constexpr (BK == 1) {
      const float2 x = ld2(p);
      b0 = opnd<cb>(x.x);
      b1 = opnd<cb>(x.y);
    } else {
      b0 = opnd<cb>(to_f(p[0]));
      b1 = opnd<cb>(to_f(p[BK]));
    }
#pragma unroll
    for (int m = 0; m < MT; ++m) mma8(acc[m][n], a[m], b0, b1);
  }
}

// One warp: acc[m][n] += A[16m.., 0:KD] B[0:KD, 8n..], A and B pointing at the warp's tile origin.
// Fragment element r of acc[m][n] is row 16m + g + 8 (r / 2), column 8n + 2t + (r % 2) of the
// tile, g = lane / 4, t = lane % 4.
template <int MT, int NT, int KD, int AI, int AK, int BK, int BN, bool CA = false, bool CB = false,
          typename TA, typename TB>
__device__ __forceinline__ void gemm(float (&acc)[MT][NT][4], const TA* A, const TB* B,
                                     int lane) {
  const int g = lane >> 2, t = lane & 3;
  A += g * AI + 2 * t * AK;
  B += 2 * t * BK + g * BN;
#pragma unroll
  for (int k0 = 0; k0 < KD; k0 += 8)
    kstep<MT, NT, AI, AK, BK, BN, CA, CB>(acc, A + k0 * AK, B + k0 * BK);
}

// The same over a depth kd known at run time (a multiple of 8), operands already rounded.
template <int MT, int NT, int AI, int AK, int BK, int BN>
__device__ __forceinline__ void gemm_to(float (&acc)[MT][NT][4], const float* A, const float* B,
                                        int kd, int lane) {
  const int g = lane >> 2, t = lane & 3;
  A += g * AI + 2 * t * AK;
  B += 2 * t * BK + g * BN;
#pragma unroll 2
  for (int k0 = 0; k0 < kd; k0 += 8)
    kstep<MT, NT, AI, AK, BK, BN, false, false>(acc, A + k0 * AK, B + k0 * BK);
}

template <int MT, int NT>
__device__ __forceinline__ void zero(float (&acc)[MT][NT][4]) {
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[m][n][r] = 0.f;
}

__device__ __forceinline__ void cp16(void* dst, const void* src) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(src));
}
__device__ __forceinline__ void cp4(float* dst, const float* src) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(s), "l"(src));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }

// ROWS x COLS elements (16 bytes a multiple of a row) from global rows of stride sst into shared
// rows of stride LD (elements; 16-byte aligned rows), 16 bytes per cp.async, thread tid of NT
// taking pieces tid, tid + NT, ...; rows >= L are zero-filled.
template <int ROWS, int COLS, int LD, int NT = kThreads, typename T>
__device__ __forceinline__ void load_tile(T* dst, const T* src, long sst, int L, int tid) {
  constexpr int E = 16 / sizeof(T), C4 = COLS / E, N = ROWS * C4;
  static_assert(COLS % E == 0 && (LD * sizeof(T)) % 16 == 0, "16-byte pieces");
#pragma unroll
  for (int it = 0; it < (N + NT - 1) / NT; ++it) {
    const int idx = tid + it * NT;
    if (N % NT == 0 || idx < N) {
      const int r = idx / C4, c = (idx % C4) * E;
      if (r < L) cp16(dst + r * LD + c, src + r * sst + c);
      else *reinterpret_cast<float4*>(dst + r * LD + c) = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
}

// The same into float32 shared rows: float32 sources by cp.async (load_tile), bf16 / fp16
// sources by 16-byte loads widened to float32 here (synchronous).
template <int ROWS, int COLS, int LD, typename T>
__device__ __forceinline__ void load_tile_f32(float* dst, const T* src, long sst, int L, int tid) {
  if constexpr (is_f32<T>) {
    load_tile<ROWS, COLS, LD>(dst, src, sst, L, tid);
  } else {
    constexpr int C8 = COLS / 8, N = ROWS * C8, IT = (N + kThreads - 1) / kThreads;
    static_assert(COLS % 8 == 0, "16-byte pieces");
    uint4 raw[IT];
#pragma unroll
    for (int it = 0; it < IT; ++it) {  // every load in flight before the first is used
      const int idx = tid + it * kThreads, r = idx / C8, c = (idx % C8) * 8;
      raw[it] = (N % kThreads == 0 || idx < N) && r < L
                    ? __ldg(reinterpret_cast<const uint4*>(src + r * sst + c))
                    : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int it = 0; it < IT; ++it) {
      const int idx = tid + it * kThreads, r = idx / C8, c = (idx % C8) * 8;
      if (N % kThreads == 0 || idx < N) {
        const T* e = reinterpret_cast<const T*>(&raw[it]);
        float4* d = reinterpret_cast<float4*>(dst + r * LD + c);
        d[0] = make_float4(to_f(e[0]), to_f(e[1]), to_f(e[2]), to_f(e[3]));
        d[1] = make_float4(to_f(e[4]), to_f(e[5]), to_f(e[6]), to_f(e[7]));
      }
    }
  }
}

// Round to tf32, in place, the pieces this thread copied with load_tile (after its cp.async wait:
// a thread sees its own copies without a barrier).
template <int ROWS, int COLS, int LD>
__device__ __forceinline__ void round_tile(float* t, int L, int tid) {
  constexpr int C4 = COLS / 4, N = ROWS * C4;
#pragma unroll
  for (int it = 0; it < (N + kThreads - 1) / kThreads; ++it) {
    const int idx = tid + it * kThreads;
    if (N % kThreads == 0 || idx < N) {
      const int r = idx / C4, c = (idx % C4) * 4;
      if (r < L) {
        float4* p = reinterpret_cast<float4*>(t + r * LD + c);
        float4 x = *p;
        x.x = rtf32(x.x);
        x.y = rtf32(x.y);
        x.z = rtf32(x.z);
        x.w = rtf32(x.w);
        *p = x;
      }
    }
  }
}

// ---------------------------------------------------------------------------- q, k L2 norms

// Row (b, t, h) of the per-row arrays nq, nk [B, T, H].
__device__ __forceinline__ long qk_row(int b, int t, int h, int T, int H) {
  return ((long)b * T + t) * H + h;
}
// The per-row factor of a norm array, 1 where there is none (no L2 norm: products unchanged).
__device__ __forceinline__ float norm_at(const float* __restrict__ n, long row) {
  return n ? n[row] : 1.f;
}

// nq, nk = 1 / sqrt(sum x^2 + 1e-6) over each row of q and k (the models' in-kernel L2 norm,
// applied by the three kernels to the products they form from raw q and k), a warp per row,
// float32 sums in a fixed order.
template <typename QT>
__global__ void __launch_bounds__(kThreads)
mma_l2_norms(const QT* __restrict__ q, const QT* __restrict__ k, float* __restrict__ nq,
             float* __restrict__ nk, long rows, int K) {
  const long r = (long)blockIdx.x * (kThreads / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;
  float sq = 0.f, sk = 0.f;
  for (int c = lane; c < K; c += 32) {
    const float a = to_f(q[r * K + c]), b = to_f(k[r * K + c]);
    sq += a * a;
    sk += b * b;
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    sq += __shfl_xor_sync(0xffffffffu, sq, off);
    sk += __shfl_xor_sync(0xffffffffu, sk, off);
  }
  if (lane == 0) {
    nq[r] = 1.f / sqrtf(sq + 1e-6f);
    nk[r] = 1.f / sqrtf(sk + 1e-6f);
  }
}

// ------------------------------------------------------------------------------------ prepare

template <int K, int V>
struct PrepSmem {
  static constexpr int SK = K + 8, SV = V + 4;
  static constexpr int Ks = 0, Vs = Ks + kC * SK, As = Vs + kC * SV, Xs = As + kC * kPS,
                       gc = Xs + kC * kPS, bt = gc + kC, fk = bt + kC, nk = fk + kC,
                       floats = nk + kC;
};

// One warp, 32 columns of R (row stride LDR; the tf32 right-hand sides, replaced in place by the
// solution): (I + A) Y = R by blocked forward substitution over the four 16-row blocks,
//   T = R_I - sum_{J<I} A_IJ Y_J (tf32 operands, float32 sums), Y_I = (I + A_II)^-1 T,
// with A's blocks below the diagonal blocks and the inverse diagonal blocks Xd (row stride kPS)
// already rounded to tf32. Y rows < L go to out (row stride ldo) as float32, or rounded to tf32
// when round_out (an operand only).
template <int LDR>
__device__ __forceinline__ void solve_block_columns(const float* As, const float* Xd, float* R,
                                                    float* out, long ldo, bool round_out, int L,
                                                    int lane) {
  const int gq = lane >> 2, tq = lane & 3;
#pragma unroll
  for (int I = 0; I < 4; ++I) {
    float acc[1][4][4];
    zero(acc);
    if (I > 0) gemm_to<1, 4, kPS, 1, LDR, 1>(acc, As + 16 * I * kPS, R, 16 * I, lane);
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        float2* p = reinterpret_cast<float2*>(R + (16 * I + gq + 8 * hf) * LDR + nt * 8 + 2 * tq);
        const float2 r = *p;
        *p = make_float2(rtf32(r.x - acc[0][nt][2 * hf]), rtf32(r.y - acc[0][nt][2 * hf + 1]));
      }
    __syncwarp();
    float y[1][4][4];
    zero(y);
    gemm<1, 4, 16, kPS, 1, LDR, 1>(y, Xd + 16 * I * kPS + 16 * I, R + 16 * I * LDR, lane);
    __syncwarp();  // every lane has read T before it is overwritten
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int i = 16 * I + gq + 8 * hf, c = nt * 8 + 2 * tq;
        const float y0 = y[0][nt][2 * hf], y1 = y[0][nt][2 * hf + 1];
        const float2 yr = make_float2(rtf32(y0), rtf32(y1));
        *reinterpret_cast<float2*>(R + i * LDR + c) = yr;
        if (i < L) *reinterpret_cast<float2*>(out + i * ldo + c) = round_out ? yr : make_float2(y0, y1);
      }
    __syncwarp();  // Y_I is visible to the warp before the next block reads it
  }
}

template <int K, int V, typename QT>
__global__ void __launch_bounds__(kThreads, 2)
mma_prepare(const QT* __restrict__ k, const QT* __restrict__ v, const float* __restrict__ g,
            const float* __restrict__ beta, const float* __restrict__ nk,
            float* __restrict__ gcum, float* __restrict__ W,
            float* __restrict__ U, int T, int H, int HV, int NC) {
  using S = PrepSmem<K, V>;
  constexpr int SK = S::SK, SV = S::SV;
  extern __shared__ float4 smem4[];
  float* sm = reinterpret_cast<float*>(smem4);
  float* Ks = sm + S::Ks;  // [C][SK]  keys, then tf32(beta exp(gc) K), then W (tf32)
  float* Vs = sm + S::Vs;  // [C][SV]  values, then tf32(beta V), then tf32(U)
  float* As = sm + S::As;  // [C][PS]  A (strictly lower), float32; below the diagonal blocks tf32
  float* Xs = sm + S::Xs;  // [C][PS]  the diagonal blocks of (I + A)^-1, tf32
  float* gc = sm + S::gc;  // [C] cumulative log decay
  float* bt = sm + S::bt;  // [C] beta
  float* fk = sm + S::fk;  // [C] beta exp(gc) nk
  float* nkv = sm + S::nk;  // [C] the keys' L2-norm factors (1: none)
  const int bh = blockIdx.x / NC, n = blockIdx.x % NC, b = bh / HV, hv = bh % HV;
  const int h = hv / (HV / H), t0 = n * kC, L = gdn::imin(kC, T - t0);
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, gq = lane >> 2, tq = lane & 3;
  load_tile_f32<kC, K, SK>(Ks, k + gdn::qk_index(b, t0, h, T, H, K), (long)H * K, L, tid);
  load_tile_f32<kC, V, SV>(Vs, v + gdn::v_index(b, t0, hv, T, HV, V), (long)HV * V, L, tid);
  cp_commit();
  if (w == 0) {  // inclusive scan of g over the chunk, two steps per lane
    const int i0 = 2 * lane, i1 = i0 + 1;
    const float a0 = i0 < L ? g[gdn::gate_index(b, t0 + i0, hv, T, HV)] : 0.f;
    const float a1 = i1 < L ? g[gdn::gate_index(b, t0 + i1, hv, T, HV)] : 0.f;
    float s = a0 + a1;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const float y = __shfl_up_sync(0xffffffffu, s, off);
      if (lane >= off) s += y;
    }
    float ex = __shfl_up_sync(0xffffffffu, s, 1);
    if (lane == 0) ex = 0.f;
    const float c0 = ex + a0, c1 = c0 + a1;
    const float b0 = i0 < L ? beta[gdn::gate_index(b, t0 + i0, hv, T, HV)] : 0.f;
    const float b1 = i1 < L ? beta[gdn::gate_index(b, t0 + i1, hv, T, HV)] : 0.f;
    gc[i0] = c0;
    gc[i1] = c1;
    bt[i0] = b0;
    bt[i1] = b1;
    const float n0 = i0 < L ? norm_at(nk, qk_row(b, t0 + i0, h, T, H)) : 1.f;
    const float n1 = i1 < L ? norm_at(nk, qk_row(b, t0 + i1, h, T, H)) : 1.f;
    nkv[i0] = n0;
    nkv[i1] = n1;
    fk[i0] = b0 * expf(c0) * n0;
    fk[i1] = b1 * expf(c1) * n1;
    if (i0 < L) gcum[gdn::ws_row(b, hv, t0 + i0, HV, T)] = c0;
    if (i1 < L) gcum[gdn::ws_row(b, hv, t0 + i1, HV, T)] = c1;
  }
  cp_wait<0>();
  __syncthreads();
  {  // A = K K^T, decayed and scaled, strictly lower (raw keys rounded at the fragment loads)
    const int i0 = (w & 3) * 16, n0 = (w >> 2) * 32;
    float acc[1][4][4];
    zero(acc);
    if (n0 <= i0 + 15)
      gemm<1, 4, K, SK, 1, 1, SK, true, true>(acc, Ks + i0 * SK, Ks + n0 * SK, lane);
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int i = i0 + gq + 8 * (r >> 1), j = n0 + nt * 8 + 2 * tq + (r & 1);
        const float a = j < i ? bt[i] * (acc[0][nt][r] * (nkv[i] * nkv[j])) * expf(gc[i] - gc[j])
                              : 0.f;
        As[i * kPS + j] = j / 16 < i / 16 ? rtf32(a) : a;  // below the diagonal blocks: operands
      }
  }
  __syncthreads();
  if (tid < 64) {  // warps 0-1: the diagonal blocks of (I + A)^-1, one column each
    const int o = (tid / 16) * 16, j = tid % 16;
    float x[16];
    gdn::inverse_diag16_column(As, kPS, o, j, x);
#pragma unroll
    for (int i = 0; i < 16; ++i) Xs[(o + i) * kPS + o + j] = rtf32(x[i]);
  } else {  // warps 2-7: the right-hand sides, rounded: tf32(beta exp(gc) K), tf32(beta V)
    constexpr int K4 = K / 4, V4 = V / 4;
    for (int idx = tid - 64; idx < kC * K4; idx += kThreads - 64) {
      const int r = idx / K4, c = (idx % K4) * 4;
      float4* p = reinterpret_cast<float4*>(Ks + r * SK + c);
      const float4 x = *p;
      const float f = fk[r];
      *p = make_float4(rtf32(x.x * f), rtf32(x.y * f), rtf32(x.z * f), rtf32(x.w * f));
    }
    for (int idx = tid - 64; idx < kC * V4; idx += kThreads - 64) {
      const int r = idx / V4, c = (idx % V4) * 4;
      float4* p = reinterpret_cast<float4*>(Vs + r * SV + c);
      const float4 x = *p;
      const float f = bt[r];
      *p = make_float4(rtf32(x.x * f), rtf32(x.y * f), rtf32(x.z * f), rtf32(x.w * f));
    }
  }
  __syncthreads();
  // W = (I + A)^-1 (beta exp(gc) K) (stored rounded: an operand only), U = (I + A)^-1 (beta V)
  // (float32), 32 columns of [K | V] per warp, no block-wide barrier
  for (int cb = w; cb < (K + V) / 32; cb += 8) {
    const long row = gdn::ws_row(b, hv, t0, HV, T);
    if (cb * 32 < K)
      solve_block_columns<SK>(As, Xs, Ks + cb * 32, W + row * K + cb * 32, K, true, L, lane);
    else
      solve_block_columns<SV>(As, Xs, Vs + cb * 32 - K, U + row * V + cb * 32 - K, V, false, L,
                              lane);
  }
}

// --------------------------------------------------------------------------------- state pass

constexpr int kBV = 32;  // value columns per block of the state pass

// One stage of the state pass: a chunk's W rows (A operand, k contiguous), keys (QT; the
// transposed A operand of the state update), U tile and cumulative decays. Offsets in floats.
template <int K, typename QT>
struct PassStage {
  static constexpr int SW = K + 8, SKK = is_f32<QT> ? K + 4 : K + 8, SQ = K + 8, SU = kBV + 8;
  static constexpr int W = 0, Kk = W + kC * SW, U = Kk + kC * SKK * (int)sizeof(QT) / 4,
                       G = U + kC * SU, NQ = G + kC, NK = NQ + kC, floats = NK + kC;
};

template <int K, typename QT>
struct PassSmem {
  using P = PassStage<K, QT>;
  static constexpr int SST = K + 8, SUT = kC + 8;
  static constexpr int Ss = 2 * P::floats, Ud = Ss + kBV * SST, Qs = Ud + kBV * SUT,
                       floats = Qs + kC * P::SQ * (int)sizeof(QT) / 4;
};

// 8 warps. W S: warp w owns rows 16 (w % 4).., columns 16 (w / 4).., its K-long sums split in two
// halves (independent mma chains). The state update: K = 128, warp w owns state rows 16 w.. and
// all 32 columns; K = 64, rows 16 (w % 4).., columns 16 (w / 4)..
template <int K, typename QT>
__global__ void __launch_bounds__(kThreads, 1)
mma_state_pass(const QT* __restrict__ q, const QT* __restrict__ k,
               const float* __restrict__ nq, const float* __restrict__ nk,
               const float* __restrict__ gcum, const float* __restrict__ W,
               float* __restrict__ U, float* __restrict__ O1, float* __restrict__ state, int T,
               int H, int HV, int V, int NC) {
  using P = PassStage<K, QT>;
  using M = PassSmem<K, QT>;
  constexpr int SST = M::SST, SUT = M::SUT, NT3 = K == 128 ? 4 : 2;
  extern __shared__ float4 smem4[];
  float* sm = reinterpret_cast<float*>(smem4);
  float* Ss = sm + M::Ss;  // [BV][SST]  tf32(state tile), transposed: the B operand of W S
  float* Ud = sm + M::Ud;  // [BV][SUT]  tf32(exp(gc_last - gc_j) U_j), transposed
  QT* Qs = reinterpret_cast<QT*>(sm + M::Qs);  // [C][SQ]  the chunk's queries (one stage)
  const int b = blockIdx.x / HV, hv = blockIdx.x % HV, h = hv / (HV / H), c0 = blockIdx.y * kBV;
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, gq = lane >> 2, tq = lane & 3;
  const int r3 = K == 128 ? 16 * w : 16 * (w & 3), n3 = K == 128 ? 0 : 16 * (w >> 2);
  const int r1 = 16 * (w & 3), n1 = 16 * (w >> 2);
  float* st = state + gdn::state_index(b, hv, HV, K, V) + c0;
  float s[1][NT3][4];  // rows r3 + gq (+8), columns n3 + 8nt + 2tq (+1)
#pragma unroll
  for (int nt = 0; nt < NT3; ++nt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int r = r3 + gq + 8 * hf, c = n3 + nt * 8 + 2 * tq;
      const float2 x = *reinterpret_cast<const float2*>(st + (long)r * V + c);
      s[0][nt][2 * hf] = x.x;
      s[0][nt][2 * hf + 1] = x.y;
    }
  auto issue = [&](int n) {
    const int t0 = n * kC, L = gdn::imin(kC, T - t0);
    float* sb = sm + (n & 1) * P::floats;
    load_tile<kC, K, P::SW>(sb + P::W, W + gdn::ws_row(b, hv, t0, HV, T) * K, K, L, tid);
    load_tile<kC, K, P::SKK>(reinterpret_cast<QT*>(sb + P::Kk),
                             k + gdn::qk_index(b, t0, h, T, H, K), (long)H * K, L, tid);
    load_tile<kC, kBV, P::SU>(sb + P::U, U + gdn::ws_row(b, hv, t0, HV, T) * V + c0, V, L, tid);
    if (tid < kC) {  // 4-byte copies: a chunk's decays need not be 16-byte aligned
      if (tid < L) cp4(sb + P::G + tid, gcum + gdn::ws_row(b, hv, t0 + tid, HV, T));
      else sb[P::G + tid] = 0.f;
    } else if (tid < 3 * kC) {  // the L2-norm factors of the chunk's queries and keys (1: none)
      const int i = (tid - kC) % kC;
      const float* nn = tid < 2 * kC ? nq : nk;
      float* d = sb + (tid < 2 * kC ? P::NQ : P::NK) + i;
      if (nn && i < L) cp4(d, nn + qk_row(b, t0 + i, h, T, H));
      else *d = 1.f;
    }
    cp_commit();
  };
  auto issue_q = [&](int n) {
    const int t0 = n * kC, L = gdn::imin(kC, T - t0);
    load_tile<kC, K, P::SQ>(Qs, q + gdn::qk_index(b, t0, h, T, H, K), (long)H * K, L, tid);
    cp_commit();
  };
  issue(0);
  issue_q(0);
  for (int n = 0; n < NC; ++n) {
    const int t0 = n * kC, L = gdn::imin(kC, T - t0);
    if (n + 1 < NC) issue(n + 1);
    // the state before this chunk, rounded, to shared memory (the B operand of W S and Q S)
#pragma unroll
    for (int nt = 0; nt < NT3; ++nt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int r = r3 + gq + 8 * hf, c = n3 + nt * 8 + 2 * tq;
        const float x0 = rtf32(s[0][nt][2 * hf]), x1 = rtf32(s[0][nt][2 * hf + 1]);
        Ss[c * SST + r] = x0;
        Ss[(c + 1) * SST + r] = x1;
      }
    if (n + 1 < NC) cp_wait<1>();
    else cp_wait<0>();
    __syncthreads();
    const float* sb = sm + (n & 1) * P::floats;
    const float* gc = sb + P::G;
    const float gl = gc[L - 1];
    {  // U <- U - W S (float32), stored rounded (an operand of phase 3 only)
      float ws[1][2][4], w2[1][2][4];
      zero(ws);
      zero(w2);
      const float* wa = sb + P::W + r1 * P::SW;
      const float* sbn = Ss + n1 * SST;
      gemm<1, 2, K / 2, P::SW, 1, 1, SST>(ws, wa, sbn, lane);
      gemm<1, 2, K / 2, P::SW, 1, 1, SST>(w2, wa + K / 2, sbn + K / 2, lane);
      {  // the inter-chunk part of o, O1 = exp(gc_i) q_i S (float32), for phase 3
        float qs[1][2][4], q2[1][2][4];
        zero(qs);
        zero(q2);
        const QT* qa = Qs + r1 * P::SQ;
        gemm<1, 2, K / 2, P::SQ, 1, 1, SST, true>(qs, qa, sbn, lane);
        gemm<1, 2, K / 2, P::SQ, 1, 1, SST, true>(q2, qa + K / 2, sbn + K / 2, lane);
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int i = r1 + gq + 8 * hf;
          if (i >= L) continue;
          const float e = expf(gc[i]) * sb[P::NQ + i];
#pragma unroll
          for (int nt = 0; nt < 2; ++nt) {
            const int c = n1 + nt * 8 + 2 * tq;
            *reinterpret_cast<float2*>(O1 + gdn::ws_row(b, hv, t0 + i, HV, T) * V + c0 + c) =
                make_float2(e * (qs[0][nt][2 * hf] + q2[0][nt][2 * hf]),
                            e * (qs[0][nt][2 * hf + 1] + q2[0][nt][2 * hf + 1]));
          }
        }
      }
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int i = r1 + gq + 8 * hf;
        const float d = i < L ? expf(gl - gc[i]) * sb[P::NK + i] : 0.f;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          const int c = n1 + nt * 8 + 2 * tq;
          const float2 u = *reinterpret_cast<const float2*>(sb + P::U + i * P::SU + c);
          const float x0 = u.x - (ws[0][nt][2 * hf] + w2[0][nt][2 * hf]);
          const float x1 = u.y - (ws[0][nt][2 * hf + 1] + w2[0][nt][2 * hf + 1]);
          if (i < L)
            *reinterpret_cast<float2*>(U + gdn::ws_row(b, hv, t0 + i, HV, T) * V + c0 + c) =
                make_float2(rtf32(x0), rtf32(x1));
          Ud[c * SUT + i] = rtf32(d * x0);
          Ud[(c + 1) * SUT + i] = rtf32(d * x1);
        }
      }
    }
    __syncthreads();
    if (n + 1 < NC) issue_q(n + 1);  // every warp is done with this chunk's queries
    // S <- exp(gc_last) S + K^T Ud (A(i, j) = K[j][i], raw keys rounded at the fragment load)
    const float el = expf(gl);
#pragma unroll
    for (int nt = 0; nt < NT3; ++nt)
#pragma unroll
      for (int r = 0; r < 4; ++r) s[0][nt][r] *= el;
    gemm<1, NT3, kC, 1, P::SKK, 1, SUT, true, false>(
        s, reinterpret_cast<const QT*>(sb + P::Kk) + r3, Ud + n3 * SUT, lane);
    __syncthreads();
  }
#pragma unroll
  for (int nt = 0; nt < NT3; ++nt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int r = r3 + gq + 8 * hf, c = n3 + nt * 8 + 2 * tq;
      *reinterpret_cast<float2*>(st + (long)r * V + c) =
          make_float2(s[0][nt][2 * hf], s[0][nt][2 * hf + 1]);
    }
}

// ------------------------------------------------------------------------------------- output

// o = scale (O1 + P U), O1 = exp(gc_i) q_i S from the state pass. P is computed from the
// rounded queries and keys and then written over them, so that a block needs at most about
// 100 KB of shared memory and two fit on an SM. Offsets in floats.
template <int K, int V, typename QT>
struct OutSmem {
  static constexpr int SK = K + 8, SV = V + 4, QK = kC * SK * (int)sizeof(QT) / 4;
  static constexpr int Qs = 0, Ks = Qs + QK, Us = Ks + QK, gc = Us + kC * SV, nq = gc + kC,
                       nk = nq + kC, floats = nk + kC;
  static_assert(kC * kPS <= 2 * QK, "P fits where the queries and keys were");
};

template <int K, int V, typename QT>
__global__ void __launch_bounds__(kThreads, 2)
mma_output(const QT* __restrict__ q, const QT* __restrict__ k,
             const float* __restrict__ nq, const float* __restrict__ nk,
             const float* __restrict__ gcum, const float* __restrict__ U,
             const float* __restrict__ O1, void* __restrict__ o, int T, int H, int HV,
             float scale, int odt, int NC) {
  using S = OutSmem<K, V, QT>;
  constexpr int SK = S::SK, SV = S::SV, NB = (V / 32 + 1) / 2;
  extern __shared__ float4 smem4[];
  float* sm = reinterpret_cast<float*>(smem4);
  QT* Qs = reinterpret_cast<QT*>(sm + S::Qs);  // [C][SK]  queries (float32: rounded in place)
  QT* Ks = reinterpret_cast<QT*>(sm + S::Ks);  // [C][SK]  keys (likewise)
  float* Ps = sm;          // [C][PS]  tf32(P), over the queries and keys once they are used
  float* Us = sm + S::Us;  // [C][SV]  the chunk's U (rounded by the state pass)
  float* gc = sm + S::gc;  // [C]
  float* nqv = sm + S::nq;  // [C] the L2-norm factors of the chunk's queries (1: none)
  float* nkv = sm + S::nk;  // [C] and keys
  const int bh = blockIdx.x / NC, n = blockIdx.x % NC, b = bh / HV, hv = bh % HV;
  const int h = hv / (HV / H), t0 = n * kC, L = gdn::imin(kC, T - t0);
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, gq = lane >> 2, tq = lane & 3;
  load_tile<kC, K, SK>(Qs, q + gdn::qk_index(b, t0, h, T, H, K), (long)H * K, L, tid);
  load_tile<kC, K, SK>(Ks, k + gdn::qk_index(b, t0, h, T, H, K), (long)H * K, L, tid);
  cp_commit();
  load_tile<kC, V, SV>(Us, U + gdn::ws_row(b, hv, t0, HV, T) * V, V, L, tid);
  cp_commit();
  if (tid < kC) gc[tid] = tid < L ? gcum[gdn::ws_row(b, hv, t0 + tid, HV, T)] : 0.f;
  else if (tid < 3 * kC) {
    const int i = (tid - kC) % kC;
    (tid < 2 * kC ? nqv : nkv)[i] =
        i < L ? norm_at(tid < 2 * kC ? nq : nk, qk_row(b, t0 + i, h, T, H)) : 1.f;
  }
  // the warp's output tiles (16 rows x 32 columns, row block alternating as below) start from O1
  float acc[NB][1][4][4];
#pragma unroll
  for (int jb = 0; jb < NB; ++jb) {
    const int nb = (w >> 2) + 2 * jb, i0 = 16 * ((jb & 1) ? 3 - (w & 3) : (w & 3));
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int i = i0 + gq + 8 * hf, c = nb * 32 + nt * 8 + 2 * tq;
        float2 x = make_float2(0.f, 0.f);
        if (nb < V / 32 && i < L)
          x = *reinterpret_cast<const float2*>(O1 + gdn::ws_row(b, hv, t0 + i, HV, T) * V + c);
        acc[jb][0][nt][2 * hf] = x.x;
        acc[jb][0][nt][2 * hf + 1] = x.y;
      }
  }
  cp_wait<1>();
  if constexpr (is_f32<QT>) {
    round_tile<kC, K, SK>(Qs, L, tid);
    round_tile<kC, K, SK>(Ks, L, tid);
  }
  __syncthreads();
  {  // P = (Q K^T) exp(gc_i - gc_j), lower triangle with the diagonal
    const int i0 = (w & 3) * 16, n0 = (w >> 2) * 32;
    float pa[1][4][4];
    zero(pa);
    if (n0 <= i0 + 15) gemm<1, 4, K, SK, 1, 1, SK>(pa, Qs + i0 * SK, Ks + n0 * SK, lane);
    __syncthreads();  // every warp is done with the queries and keys
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int i = i0 + gq + 8 * (r >> 1), j = n0 + nt * 8 + 2 * tq + (r & 1);
        Ps[i * kPS + j] = j <= i ? rtf32(pa[0][nt][r] * (nqv[i] * nkv[j]) * expf(gc[i] - gc[j]))
                                 : 0.f;
      }
  }
  cp_wait<0>();
  __syncthreads();
#pragma unroll
  for (int jb = 0; jb < NB; ++jb) {
    const int nb = (w >> 2) + 2 * jb, i0 = 16 * ((jb & 1) ? 3 - (w & 3) : (w & 3));
    if (nb >= V / 32) continue;
    gemm_to<1, 4, kPS, 1, SV, 1>(acc[jb], Ps + i0 * kPS, Us + nb * 32, i0 + 16, lane);
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int i = i0 + gq + 8 * hf, c = nb * 32 + nt * 8 + 2 * tq;
        if (i >= L) continue;
        const long at = gdn::v_index(b, t0 + i, hv, T, HV, V) + c;
        const float y0 = scale * acc[jb][0][nt][2 * hf], y1 = scale * acc[jb][0][nt][2 * hf + 1];
        if (odt == 1)
          reinterpret_cast<__nv_bfloat162*>(o)[at / 2] = __floats2bfloat162_rn(y0, y1);
        else if (odt == 2)
          reinterpret_cast<__half2*>(o)[at / 2] = __floats2half2_rn(y0, y1);
        else
          *reinterpret_cast<float2*>(static_cast<float*>(o) + at) = make_float2(y0, y1);
      }
  }
}

// ----------------------------------------------------------------------------------- launcher

template <typename F>
cudaError_t allow_smem(F* kernel, size_t bytes) {
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
}

template <int K, int V, typename QT>
int launch_mma(const QT* q, const QT* k, const QT* v, const float* g, const float* beta, void* o,
               float* state, float* gcum, float* W, float* U, float* O1, float* nq, float* nk,
               int B, int T, int H, int HV, float scale, int odt, cudaStream_t s) {
  const int NC = (T + kC - 1) / kC;
  const size_t s1 = sizeof(float) * PrepSmem<K, V>::floats,
               s2 = sizeof(float) * PassSmem<K, QT>::floats,
               s3 = sizeof(float) * OutSmem<K, V, QT>::floats;
  cudaError_t err;
  if ((err = allow_smem(mma_prepare<K, V, QT>, s1)) != cudaSuccess) return (int)err;
  if ((err = allow_smem(mma_state_pass<K, QT>, s2)) != cudaSuccess) return (int)err;
  if ((err = allow_smem(mma_output<K, V, QT>, s3)) != cudaSuccess) return (int)err;
  if (nq) {  // the L2 norms of q and k, applied by the three kernels
    const long rows = (long)B * T * H;
    mma_l2_norms<QT><<<(unsigned)((rows + kThreads / 32 - 1) / (kThreads / 32)), kThreads, 0, s>>>(
        q, k, nq, nk, rows, K);
  }
  mma_prepare<K, V, QT><<<B * HV * NC, kThreads, s1, s>>>(k, v, g, beta, nk, gcum, W, U, T, H,
                                                          HV, NC);
  mma_state_pass<K, QT><<<dim3(B * HV, V / kBV), kThreads, s2, s>>>(q, k, nq, nk, gcum, W, U, O1,
                                                                     state, T, H, HV, V, NC);
  mma_output<K, V, QT><<<B * HV * NC, kThreads, s3, s>>>(q, k, nq, nk, gcum, U, O1, o, T, H, HV,
                                                         scale, odt, NC);
  return (int)cudaGetLastError();
}

template <int K, typename QT>
int launch_mma_v(const void* q, const void* k, const void* v, const float* g, const float* beta,
                 void* o, float* state, float* gcum, float* W, float* U, float* O1, float* nq,
                 float* nk, int B, int T, int H, int HV, int V, float scale, int odt,
                 cudaStream_t s) {
  const QT *qt = static_cast<const QT*>(q), *kt = static_cast<const QT*>(k),
           *vt = static_cast<const QT*>(v);
#define GDN_MMA_ARGS qt, kt, vt, g, beta, o, state, gcum, W, U, O1, nq, nk, B, T, H, HV, scale, odt, s
  switch (V) {
    case 32: return launch_mma<K, 32, QT>(GDN_MMA_ARGS);
    case 64: return launch_mma<K, 64, QT>(GDN_MMA_ARGS);
    case 96: return launch_mma<K, 96, QT>(GDN_MMA_ARGS);
    case 128: return launch_mma<K, 128, QT>(GDN_MMA_ARGS);
    default: return WB_ERR_SHAPE;
  }
#undef GDN_MMA_ARGS
}

template <typename QT>
int launch_mma_k(const void* q, const void* k, const void* v, const float* g, const float* beta,
                 void* o, float* state, float* gcum, float* W, float* U, float* O1, float* nq,
                 float* nk, int B, int T, int H, int HV, int K, int V, float scale, int odt,
                 cudaStream_t s) {
  return K == 128 ? launch_mma_v<128, QT>(q, k, v, g, beta, o, state, gcum, W, U, O1, nq, nk, B,
                                          T, H, HV, V, scale, odt, s)
                  : launch_mma_v<64, QT>(q, k, v, g, beta, o, state, gcum, W, U, O1, nq, nk, B, T,
                                         H, HV, V, scale, odt, s);
}

}  // namespace

extern "C" {

// Whether the tensor-core chunked path takes this shape (chunk 64): 1 or 0.
int gdn_chunked_mma_supported(int K, int V) {
  return (K == 64 || K == 128) && (V == 32 || V == 64 || V == 96 || V == 128);
}

// Tensor-core chunked prefill (chunk 64, fp32 accumulators, tf32 operands). q, k, v: float32
// (in_dtype 0), bf16 (1) or fp16 (2), all three alike; g, beta float32. Workspace: gcum
// [B,HV,T], W [B,HV,T,K], U [B,HV,T,V], O1 [B,HV,T,V], float32, provided by the caller; nq, nk
// [B,T,H] float32 for the L2 norm of q and k (qk_l2norm; computed here), or both null for none.
// o_dtype: 0 float32, 1 bf16, 2 fp16 (o's element type); GdnArgs.chunk is 64. Returns WB_OK, a
// cudaError_t code, WB_ERR_SHAPE for a shape gdn_chunked_mma_supported refuses, or
// WB_ERR_ARGUMENT for an unknown dtype code or one norm array alone.
int gdn_chunked_mma_cuda(const GdnArgs* a) {
  if (!gdn_chunked_mma_supported(a->K, a->V) || a->chunk != 64) return WB_ERR_SHAPE;
  if (a->o_dtype < 0 || a->o_dtype > 2 || !a->nq != !a->nk) return WB_ERR_ARGUMENT;
  auto s = static_cast<cudaStream_t>(a->stream);
#define GDN_MMA_ARGS a->q, a->k, a->v, a->g, a->beta, a->o, a->state, a->gcum, a->W, a->U, a->O1, a->nq, a->nk, \
    a->B, a->T, a->H, a->HV, a->K, a->V, a->scale, a->o_dtype, s
  switch (a->in_dtype) {
    case WB_FP32: return launch_mma_k<float>(GDN_MMA_ARGS);
    case WB_BF16: return launch_mma_k<__nv_bfloat16>(GDN_MMA_ARGS);
    case WB_FP16: return launch_mma_k<__half>(GDN_MMA_ARGS);
    default: return WB_ERR_ARGUMENT;
  }
#undef GDN_MMA_ARGS
}

}  // extern "C"
