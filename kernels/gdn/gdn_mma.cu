// Tensor-core chunked prefill of GDN (the CUDA build's "mma" path, for bf16/fp16 inputs).
//
// Same chunked UT/WY algebra as gdn_common.h (chunk C = 64, gc the within-chunk cumulative log
// decay, A[i][j] = beta_i (k_i . k_j) exp(gc_i - gc_j) for j < i), in three launches whose
// matrix products run on tensor cores: mma.sync m16n8k8 with tf32 operands (fp32 rounded to
// nearest tf32, 10-bit mantissa) and fp32 accumulators. Operands are the float32 tensors the
// launcher staged (bf16 inputs widened, q/k L2-normalized in fp32) and fp32 intermediates; tf32
// keeps their rounding (2^-11 relative) well below the bf16 rounding of the inputs (2^-8).
//   1. prepare, one block per (b, hv, chunk): A by mma, X = (I + A)^-1 in shared memory (16 x 16
//      diagonal blocks by forward substitution, then the off-diagonal blocks: gdn_mma.h),
//      W = X (beta exp(gc) K), U = X (beta V) by mma.
//   2. state pass, one block of 8 warps per (b, hv, 32 value columns), sequential over chunks: the
//      state tile lives in mma accumulators; per chunk U <- U - W S, S is saved for phase 3 (Sh),
//      and S <- exp(gc_last) S + K^T (exp(gc_last - gc_j) U_j); the next chunk's W, K, U tile and
//      decays are copied into shared memory (cp.async) while this one computes.
//   3. output, one block per (b, hv, chunk): o = scale (exp(gc_i) q_i S + sum_{j<=i} P_ij U_j) with
//      P = (Q K^T) * exp(gc_i - gc_j), both products by mma; P is computed while S and U arrive.
// Workspace (float32): gcum [B,HV,T], W [B,HV,T,K], U [B,HV,T,V], Sh [B,HV,NC,K,V].
#include <cuda_runtime.h>
#include <stdint.h>

#include "gdn/gdn_common.h"
#include "gdn/gdn_mma.h"

namespace {

struct BlockSync {
  __device__ __forceinline__ void operator()() const { __syncthreads(); }
};

constexpr int kC = 64;         // chunk length
constexpr int kBV = 32;        // value columns per block of the state pass
constexpr int kPS = kC + 4;    // row stride of the C x C tiles (A, X, P): conflict-free A loads

__device__ __forceinline__ uint32_t tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}

__device__ __forceinline__ void mma8(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                     uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// One warp: acc[m][n] += A[i0 + 16m.., 0:kd] B[0:kd, n0 + 8n..] with element (i, k) of A at
// A[i * ai + k * ak] and (k, n) of B at B[k * bk + n * bn] (shared memory). Fragment element r
// of acc[m][n] is row i0 + 16m + g + 8 (r / 2), column n0 + 8n + 2t + (r % 2), g = lane / 4,
// t = lane % 4.
template <int MT, int NT>
__device__ __forceinline__ void warp_gemm(float (&acc)[MT][NT][4], const float* A, int ai, int ak,
                                          const float* B, int bk, int bn, int i0, int n0, int kd,
                                          int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll 2
  for (int k0 = 0; k0 < kd; k0 += 8) {
    uint32_t a[MT][4];
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      const float* p = A + (i0 + m * 16 + g) * ai + (k0 + t) * ak;
      a[m][0] = tf32(p[0]);
      a[m][1] = tf32(p[8 * ai]);
      a[m][2] = tf32(p[4 * ak]);
      a[m][3] = tf32(p[8 * ai + 4 * ak]);
    }
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      const float* p = B + (k0 + t) * bk + (n0 + n * 8 + g) * bn;
      const uint32_t b0 = tf32(p[0]), b1 = tf32(p[4 * bk]);
#pragma unroll
      for (int m = 0; m < MT; ++m) mma8(acc[m][n], a[m], b0, b1);
    }
  }
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

__device__ __forceinline__ void cp16(float* dst, const float* src) {
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

// rows x cols floats (cols % 4 == 0) from global (row stride sst) into shared (row stride dst_st);
// rows >= L are zero-filled.
__device__ __forceinline__ void load_rows(float* dst, int dst_st, const float* src, long sst,
                                          int rows, int L, int cols, int tid, int nt) {
  const int c4 = cols / 4;
  for (int idx = tid; idx < rows * c4; idx += nt) {
    const int r = idx / c4, c = (idx % c4) * 4;
    if (r < L) {
      cp16(dst + r * dst_st + c, src + r * sst + c);
    } else {
      *reinterpret_cast<float4*>(dst + r * dst_st + c) = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
}

size_t prepare_smem(int K, int V) {
  return sizeof(float) * ((size_t)kC * (K + 4) + (size_t)kC * (V + 8) + 2 * kC * kPS + 2 * kC +
                          3 * 256);
}

__global__ void __launch_bounds__(256)
mma_prepare(const float* __restrict__ k, const float* __restrict__ v, const float* __restrict__ g,
            const float* __restrict__ beta, float* __restrict__ gcum, float* __restrict__ W,
            float* __restrict__ U, int T, int H, int HV, int K, int V, int NC) {
  extern __shared__ float4 smem4[];
  float* sm = reinterpret_cast<float*>(smem4);
  const int SK = K + 4, SV = V + 8;
  float* Ks = sm;               // [C][SK]  keys, then beta exp(gc) K
  float* Vs = Ks + kC * SK;     // [C][SV]  values, then beta V
  float* As = Vs + kC * SV;     // [C][PS]  A (strictly lower)
  float* Xs = As + kC * kPS;    // [C][PS]  (I + A)^-1
  float* gc = Xs + kC * kPS;    // [C]
  float* bt = gc + kC;          // [C]
  float* Tm = bt + kC;          // [3][16][16] scratch of the blocked inversion
  const int bh = blockIdx.x / NC, n = blockIdx.x % NC, b = bh / HV, hv = bh % HV;
  const int h = hv / (HV / H), t0 = n * kC, L = gdn::imin(kC, T - t0);
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, gq = lane >> 2, tq = lane & 3;
  load_rows(Ks, SK, k + gdn::qk_index(b, t0, h, T, H, K), (long)H * K, kC, L, K, tid, 256);
  load_rows(Vs, SV, v + gdn::v_index(b, t0, hv, T, HV, V), (long)HV * V, kC, L, V, tid, 256);
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
    gc[i0] = c0;
    gc[i1] = c1;
    bt[i0] = i0 < L ? beta[gdn::gate_index(b, t0 + i0, hv, T, HV)] : 0.f;
    bt[i1] = i1 < L ? beta[gdn::gate_index(b, t0 + i1, hv, T, HV)] : 0.f;
    if (i0 < L) gcum[gdn::ws_row(b, hv, t0 + i0, HV, T)] = c0;
    if (i1 < L) gcum[gdn::ws_row(b, hv, t0 + i1, HV, T)] = c1;
  }
  cp_wait<0>();
  __syncthreads();
  {  // A = K K^T, decayed and scaled, strictly lower
    const int i0 = (w & 3) * 16, n0 = (w >> 2) * 32;
    float acc[1][4][4];
    zero(acc);
    if (n0 <= i0 + 15) warp_gemm<1, 4>(acc, Ks, SK, 1, Ks, 1, SK, i0, n0, K, lane);
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int i = i0 + gq + 8 * (r >> 1), j = n0 + nt * 8 + 2 * tq + (r & 1);
        As[i * kPS + j] = j < i ? bt[i] * acc[0][nt][r] * expf(gc[i] - gc[j]) : 0.f;
      }
  }
  __syncthreads();
  // the right-hand sides beta exp(gc) K and beta V (other arrays than the inversion's)
  for (int idx = tid; idx < kC * (K + V); idx += 256) {
    const int i = idx / (K + V), c = idx % (K + V);
    if (c < K) Ks[i * SK + c] *= bt[i] * expf(gc[i]);
    else Vs[i * SV + c - K] *= bt[i];
  }
  gdn::invert_unit_lower64(As, Xs, Tm, kPS, tid, 256, BlockSync{});
  __syncthreads();
  // W = X (beta exp(gc) K), U = X (beta V); X is lower triangular: k runs to the tile's last row
  const int i0 = (w & 3) * 16;
  for (int nb = w >> 2; nb < (K + V) / 32; nb += 2) {
    const bool isw = nb * 32 < K;
    const int c0 = isw ? nb * 32 : nb * 32 - K;
    float acc[1][4][4];
    zero(acc);
    if (isw) warp_gemm<1, 4>(acc, Xs, kPS, 1, Ks, SK, 1, i0, c0, i0 + 16, lane);
    else warp_gemm<1, 4>(acc, Xs, kPS, 1, Vs, SV, 1, i0, c0, i0 + 16, lane);
    float* out = isw ? W : U;
    const int D = isw ? K : V;
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int i = i0 + gq + 8 * hf, c = c0 + nt * 8 + 2 * tq;
        if (i < L)
          *reinterpret_cast<float2*>(out + gdn::ws_row(b, hv, t0 + i, HV, T) * D + c) =
              make_float2(acc[0][nt][2 * hf], acc[0][nt][2 * hf + 1]);
      }
  }
}

// One stage of the state pass: a chunk's W rows, keys, U tile and cumulative decays.
template <int K>
struct PassStage {
  static constexpr int SW = K + 4, SKK = K + 8, SU = kBV + 8;
  static constexpr int W = 0, Kk = W + kC * SW, U = Kk + kC * SKK, G = U + kC * SU,
                       floats = G + kC;
};

template <int K>
size_t state_pass_smem() {
  return sizeof(float) * (2 * (size_t)PassStage<K>::floats + (size_t)K * (kBV + 8) +
                          (size_t)kC * (kBV + 8));
}

// 8 warps. W S: warp w owns rows 16 (w % 4).., columns 16 (w / 4)... The state update: K = 128,
// warp w owns state rows 16 w.. and all 32 columns; K = 64, rows 16 (w % 4).., columns 16 (w / 4)..
template <int K>
__global__ void __launch_bounds__(256, 1)
mma_state_pass(const float* __restrict__ k, const float* __restrict__ gcum,
               const float* __restrict__ W, float* __restrict__ U, float* __restrict__ Sh,
               float* __restrict__ state, int T, int H, int HV, int V, int NC) {
  using P = PassStage<K>;
  constexpr int SS = kBV + 8, NT3 = K == 128 ? 4 : 2;
  extern __shared__ float4 smem4[];
  float* sm = reinterpret_cast<float*>(smem4);
  float* Ss = sm + 2 * P::floats;  // [K][SS]  state tile, the B operand of W S
  float* Ud = Ss + K * SS;         // [C][SS]  exp(gc_last - gc_j) U_j
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
    load_rows(sb + P::W, P::SW, W + gdn::ws_row(b, hv, t0, HV, T) * K, K, kC, L, K, tid, 256);
    load_rows(sb + P::Kk, P::SKK, k + gdn::qk_index(b, t0, h, T, H, K), (long)H * K, kC, L, K, tid,
              256);
    load_rows(sb + P::U, P::SU, U + gdn::ws_row(b, hv, t0, HV, T) * V + c0, V, kC, L, kBV, tid,
              256);
    if (tid < kC) {  // 4-byte copies: a chunk's decays need not be 16-byte aligned
      if (tid < L) cp4(sb + P::G + tid, gcum + gdn::ws_row(b, hv, t0 + tid, HV, T));
      else sb[P::G + tid] = 0.f;
    }
    cp_commit();
  };
  issue(0);
  for (int n = 0; n < NC; ++n) {
    const int t0 = n * kC, L = gdn::imin(kC, T - t0);
    if (n + 1 < NC) issue(n + 1);
    // the state before this chunk: to shared memory (B operand) and to Sh (phase 3)
    float* sh = Sh + (((long)b * HV + hv) * NC + n) * (long)K * V + c0;
#pragma unroll
    for (int nt = 0; nt < NT3; ++nt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int r = r3 + gq + 8 * hf, c = n3 + nt * 8 + 2 * tq;
        const float2 x = make_float2(s[0][nt][2 * hf], s[0][nt][2 * hf + 1]);
        *reinterpret_cast<float2*>(Ss + r * SS + c) = x;
        *reinterpret_cast<float2*>(sh + (long)r * V + c) = x;
      }
    if (n + 1 < NC) cp_wait<1>();
    else cp_wait<0>();
    __syncthreads();
    const float* sb = sm + (n & 1) * P::floats;
    const float* gc = sb + P::G;
    const float gl = gc[L - 1];
    {  // U <- U - W S
      float ws[1][2][4];
      zero(ws);
      warp_gemm<1, 2>(ws, sb + P::W, P::SW, 1, Ss, SS, 1, r1, n1, K, lane);
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int i = r1 + gq + 8 * hf;
        const float d = i < L ? expf(gl - gc[i]) : 0.f;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          const int c = n1 + nt * 8 + 2 * tq;
          const float2 u = *reinterpret_cast<const float2*>(sb + P::U + i * P::SU + c);
          const float x0 = u.x - ws[0][nt][2 * hf], x1 = u.y - ws[0][nt][2 * hf + 1];
          if (i < L)
            *reinterpret_cast<float2*>(U + gdn::ws_row(b, hv, t0 + i, HV, T) * V + c0 + c) =
                make_float2(x0, x1);
          *reinterpret_cast<float2*>(Ud + i * SS + c) = make_float2(d * x0, d * x1);
        }
      }
    }
    __syncthreads();
    // S <- exp(gc_last) S + K^T Ud (A(i, j) = K[j][i])
    const float el = expf(gl);
#pragma unroll
    for (int nt = 0; nt < NT3; ++nt)
#pragma unroll
      for (int r = 0; r < 4; ++r) s[0][nt][r] *= el;
    warp_gemm<1, NT3>(s, sb + P::Kk, 1, P::SKK, Ud, SS, 1, r3, n3, kC, lane);
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

size_t output_smem(int K, int V) {
  return sizeof(float) * (2 * (size_t)kC * (K + 4) + (size_t)kC * kPS + (size_t)K * (V + 8) +
                          (size_t)kC * (V + 8) + kC);
}

__global__ void __launch_bounds__(256)
mma_output(const float* __restrict__ q, const float* __restrict__ k,
           const float* __restrict__ gcum, const float* __restrict__ U,
           const float* __restrict__ Sh, float* __restrict__ o, int T, int H, int HV, int K, int V,
           float scale, int NC) {
  extern __shared__ float4 smem4[];
  float* sm = reinterpret_cast<float*>(smem4);
  const int SK = K + 4, SV = V + 8;
  float* Qs = sm;              // [C][SK]
  float* Ks = Qs + kC * SK;    // [C][SK]
  float* Ps = Ks + kC * SK;    // [C][PS]
  float* Ss = Ps + kC * kPS;   // [K][SV]  state before the chunk
  float* Us = Ss + K * SV;     // [C][SV]
  float* gc = Us + kC * SV;    // [C]
  const int bh = blockIdx.x / NC, n = blockIdx.x % NC, b = bh / HV, hv = bh % HV;
  const int h = hv / (HV / H), t0 = n * kC, L = gdn::imin(kC, T - t0);
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, gq = lane >> 2, tq = lane & 3;
  load_rows(Qs, SK, q + gdn::qk_index(b, t0, h, T, H, K), (long)H * K, kC, L, K, tid, 256);
  load_rows(Ks, SK, k + gdn::qk_index(b, t0, h, T, H, K), (long)H * K, kC, L, K, tid, 256);
  cp_commit();
  // second group: the state before the chunk and U, in flight while P is computed
  load_rows(Ss, SV, Sh + ((long)bh * NC + n) * (long)K * V, V, K, K, V, tid, 256);
  load_rows(Us, SV, U + gdn::ws_row(b, hv, t0, HV, T) * V, V, kC, L, V, tid, 256);
  cp_commit();
  if (tid < kC) gc[tid] = tid < L ? gcum[gdn::ws_row(b, hv, t0 + tid, HV, T)] : 0.f;
  cp_wait<1>();
  __syncthreads();
  const int i0 = (w & 3) * 16;
  {  // P = (Q K^T) exp(gc_i - gc_j), lower triangle with the diagonal
    const int n0 = (w >> 2) * 32;
    float acc[1][4][4];
    zero(acc);
    if (n0 <= i0 + 15) warp_gemm<1, 4>(acc, Qs, SK, 1, Ks, 1, SK, i0, n0, K, lane);
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int i = i0 + gq + 8 * (r >> 1), j = n0 + nt * 8 + 2 * tq + (r & 1);
        Ps[i * kPS + j] = j <= i ? acc[0][nt][r] * expf(gc[i] - gc[j]) : 0.f;
      }
  }
  cp_wait<0>();
  __syncthreads();
  const float e0 = expf(gc[i0 + gq]), e1 = expf(gc[i0 + gq + 8]);
  for (int nb = w >> 2; nb < V / 32; nb += 2) {
    float acc[1][4][4];
    zero(acc);
    warp_gemm<1, 4>(acc, Qs, SK, 1, Ss, SV, 1, i0, nb * 32, K, lane);
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
      acc[0][nt][0] *= e0;
      acc[0][nt][1] *= e0;
      acc[0][nt][2] *= e1;
      acc[0][nt][3] *= e1;
    }
    warp_gemm<1, 4>(acc, Ps, kPS, 1, Us, SV, 1, i0, nb * 32, i0 + 16, lane);
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int i = i0 + gq + 8 * hf, c = nb * 32 + nt * 8 + 2 * tq;
        if (i < L)
          *reinterpret_cast<float2*>(o + gdn::v_index(b, t0 + i, hv, T, HV, V) + c) =
              make_float2(scale * acc[0][nt][2 * hf], scale * acc[0][nt][2 * hf + 1]);
      }
  }
}

template <typename F>
cudaError_t allow_smem(F* kernel, size_t bytes) {
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
}

template <int K>
int launch_state_pass(const float* k, const float* gcum, const float* W, float* U, float* Sh,
                      float* state, int B, int T, int H, int HV, int V, int NC,
                      cudaStream_t stream) {
  const size_t s2 = state_pass_smem<K>();
  cudaError_t err = allow_smem(mma_state_pass<K>, s2);
  if (err != cudaSuccess) return (int)err;
  mma_state_pass<K><<<dim3(B * HV, V / kBV), 256, s2, stream>>>(k, gcum, W, U, Sh, state, T, H,
                                                                 HV, V, NC);
  return 0;
}

}  // namespace

extern "C" {

// Whether the tensor-core chunked path takes this shape (chunk 64): 1 or 0.
int gdn_chunked_mma_supported(int K, int V) {
  return (K == 64 || K == 128) && V % 32 == 0 && V >= 32 && V <= 128;
}

// Tensor-core chunked prefill (chunk 64, fp32 accumulators, tf32 operands). Workspace: gcum
// [B,HV,T], W [B,HV,T,K], U [B,HV,T,V], Sh [B,HV,ceil(T/64),K,V], float32, provided by the caller.
// Returns 0, a cudaError_t code, or -1 for a shape gdn_chunked_mma_supported refuses.
int gdn_chunked_mma_cuda(const float* q, const float* k, const float* v, const float* g,
                         const float* beta, float* o, float* state, float* gcum, float* W,
                         float* U, float* Sh, int B, int T, int H, int HV, int K, int V,
                         float scale, void* stream) {
  if (!gdn_chunked_mma_supported(K, V)) return -1;
  auto s = static_cast<cudaStream_t>(stream);
  const int NC = (T + kC - 1) / kC;
  const size_t s1 = prepare_smem(K, V), s3 = output_smem(K, V);
  cudaError_t err;
  if ((err = allow_smem(mma_prepare, s1)) != cudaSuccess) return (int)err;
  if ((err = allow_smem(mma_output, s3)) != cudaSuccess) return (int)err;
  mma_prepare<<<B * HV * NC, 256, s1, s>>>(k, v, g, beta, gcum, W, U, T, H, HV, K, V, NC);
  const int rc = K == 128 ? launch_state_pass<128>(k, gcum, W, U, Sh, state, B, T, H, HV, V, NC, s)
                          : launch_state_pass<64>(k, gcum, W, U, Sh, state, B, T, H, HV, V, NC, s);
  if (rc != 0) return rc;
  mma_output<<<B * HV * NC, 256, s3, s>>>(q, k, gcum, U, Sh, o, T, H, HV, K, V, scale, NC);
  return (int)cudaGetLastError();
}

}  // extern "C"
