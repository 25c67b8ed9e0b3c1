// CUDA build of the GDN kernels. The chunked prefill runs the same element code as the CPU build
// in three launches (gdn::chunk_prepare per chunk, gdn::chunk_state_pass per (b, hv, 16 value
// columns) sequential over chunks, gdn::chunk_output per chunk), scratch in shared memory;
// the recurrence (prefill and batched decode, T = 1) keeps the state in registers: a block of
// 4 warps owns 32 value columns (one per lane, so state loads are coalesced rows) and each warp
// one quarter of the K rows; partial dot products meet in shared memory.
#ifdef WB_CUDA_EMU
// the host emulation of CUDA, for CPU tests (gdn_cuda_emu.cpp): blocks run one after another,
// so a kernel's static shared arrays are function statics there
#include "common/cuda_emu.h"
#define WB_STATIC_SMEM static
#else
#include <cuda_runtime.h>
#define WB_LAUNCH(g, b, m, s, ...) __VA_ARGS__<<<g, b, m, s>>>
#define WB_DYNAMIC_SMEM(T, name) extern __shared__ T name[]
#define WB_STATIC_SMEM __shared__
#endif

#include "common/wb_elem.h"

#include "gdn/gdn_abi.h"
#include "gdn/gdn_common.h"

namespace {

constexpr int kLanes = 32;
constexpr int kSlices = 4;

struct BlockSync {
  __device__ __forceinline__ void operator()() const { __syncthreads(); }
};

// The recurrence. q, k, v are read in the dtype `in_dt`, g in `g_dt`, beta in `beta_dt` (each
// float32, bf16 or fp16, widened exactly); o is written in `o_dt`. The initial state is read
// from h0 (or zeros when `zero`, or from `state` itself when h0 is null) and the final state
// written to `state`, so a decode step needs no staging copies. `l2`: the models' L2 norm of q
// and k rows, applied here (warps 0 and 1 form the factors as gdn_mma.cu's norm kernel does).
template <int K, typename Acc>
__global__ void __launch_bounds__(kLanes * kSlices)
recurrent_kernel(const void* __restrict__ q, const void* __restrict__ k,
                 const void* __restrict__ v, const void* __restrict__ g,
                 const void* __restrict__ beta, void* __restrict__ o,
                 const float* __restrict__ h0, float* __restrict__ state, int T, int H, int HV,
                 int V, float scale, int in_dt, int g_dt, int beta_dt, int o_dt, int l2,
                 int zero) {
  constexpr int RK = K / kSlices;
  WB_STATIC_SMEM float ks[K], qs[K], nrm[2];
  WB_STATIC_SMEM Acc red[kSlices][kLanes];
  const int b = blockIdx.x / HV, hv = blockIdx.x % HV, h = hv / (HV / H);
  const int lane = threadIdx.x % kLanes, w = threadIdx.x / kLanes;
  const int c = blockIdx.y * kLanes + lane;
  const bool active = c < V;
  const long at = gdn::state_index(b, hv, HV, K, V) + (long)w * RK * V + c;
  const float* src = h0 ? h0 + at : state + at;
  float s[RK];
#pragma unroll
  for (int i = 0; i < RK; ++i) s[i] = active && !zero ? src[(long)i * V] : 0.f;
  float* st = state + at;
  for (int t = 0; t < T; ++t) {
    const long qk = gdn::qk_index(b, t, h, T, H, K);
    for (int i = threadIdx.x; i < K; i += kLanes * kSlices) {
      ks[i] = wb_load(k, qk + i, in_dt);
      qs[i] = wb_load(q, qk + i, in_dt);
    }
    const long gi = gdn::gate_index(b, t, hv, T, HV);
    const Acc decay = gdn::expo<Acc>((Acc)wb_load(g, gi, g_dt));
    const Acc bt = (Acc)wb_load(beta, gi, beta_dt);
    const Acc vi = active ? (Acc)wb_load(v, gdn::v_index(b, t, hv, T, HV, V) + c, in_dt) : Acc(0);
    __syncthreads();
    float fq = 1.f, fk = 1.f;
    if (l2) {
      if (w < 2) {
        const float* x = w == 0 ? qs : ks;
        float sq = 0.f;
        for (int i = lane; i < K; i += kLanes) sq += x[i] * x[i];
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, off);
        if (lane == 0) nrm[w] = 1.f / sqrtf(sq + 1e-6f);
      }
      __syncthreads();
      fq = nrm[0];
      fk = nrm[1];
    }
    Acc p = 0;
#pragma unroll
    for (int i = 0; i < RK; ++i) p += (Acc)s[i] * (Acc)(ks[w * RK + i] * fk);
    red[w][lane] = p;
    __syncthreads();
    Acc kv = 0;
#pragma unroll
    for (int j = 0; j < kSlices; ++j) kv += red[j][lane];
    const Acc u = gdn::delta_u<Acc>(bt, vi, decay, kv);
    Acc po = 0;
#pragma unroll
    for (int i = 0; i < RK; ++i) {
      s[i] = gdn::state_update<Acc>(s[i], decay, ks[w * RK + i] * fk, u);
      po += (Acc)s[i] * (Acc)(qs[w * RK + i] * fq);
    }
    __syncthreads();
    red[w][lane] = po;
    __syncthreads();
    if (w == 0 && active) {
      Acc acc = 0;
#pragma unroll
      for (int j = 0; j < kSlices; ++j) acc += red[j][lane];
      wb_store(o, gdn::v_index(b, t, hv, T, HV, V) + c, (float)((Acc)scale * acc), o_dt);
    }
  }
  if (active) {
#pragma unroll
    for (int i = 0; i < RK; ++i) st[(long)i * V] = s[i];
  }
}

template <typename Acc>
__global__ void __launch_bounds__(256)
prepare_kernel(const float* k, const float* v, const float* g, const float* beta, float* gcum,
               float* W, float* U, int T, int H, int HV, int K, int V, int C, int NC) {
  WB_DYNAMIC_SMEM(float, smem);
  const int bh = blockIdx.x / NC, n = blockIdx.x % NC;
  gdn::chunk_prepare<Acc>(k, v, g, beta, gcum, W, U, T, H, HV, K, V, C, bh / HV, bh % HV, n,
                          threadIdx.x, blockDim.x, BlockSync{}, smem, true);
}

template <typename Acc>
__global__ void __launch_bounds__(128)
state_pass_kernel(const float* q, const float* k, const float* gcum, const float* W, float* U,
                  float* o, float* state, int T, int H, int HV, int K, int V, int C, int BV) {
  WB_DYNAMIC_SMEM(float, smem);
  gdn::chunk_state_pass<Acc>(q, k, gcum, W, U, o, state, T, H, HV, K, V, C, blockIdx.x / HV,
                             blockIdx.x % HV, blockIdx.y * BV, BV, threadIdx.x, blockDim.x,
                             BlockSync{}, smem, true);
}

template <typename Acc>
__global__ void __launch_bounds__(256)
output_kernel(const float* q, const float* k, const float* gcum, const float* U, float* o, int T,
              int H, int HV, int K, int V, float scale, int C, int NC) {
  WB_DYNAMIC_SMEM(float, smem);
  const int bh = blockIdx.x / NC, n = blockIdx.x % NC;
  gdn::chunk_output<Acc>(q, k, gcum, U, o, T, H, HV, K, V, scale, C, bh / HV, bh % HV, n,
                         threadIdx.x, blockDim.x, BlockSync{}, smem, true);
}

template <typename F>
cudaError_t allow_smem(F* kernel, size_t bytes) {
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
}

template <typename Acc>
int launch_recurrent(const GdnArgs* a, cudaStream_t stream) {
  const dim3 grid(a->B * a->HV, (a->V + kLanes - 1) / kLanes), block(kLanes * kSlices);
#define GDN_CASE(KK)                                                                           \
  case KK:                                                                                     \
    WB_LAUNCH(grid, block, 0, stream, recurrent_kernel<KK, Acc>)(                              \
        a->q, a->k, a->v, a->g, a->beta, a->o, a->h0, a->state, a->T, a->H, a->HV, a->V,       \
        a->scale, a->in_dtype, a->g_dtype, a->beta_dtype, a->o_dtype, a->qk_l2norm, a->zero_state); \
    break;
  switch (a->K) {
    GDN_CASE(16) GDN_CASE(32) GDN_CASE(64) GDN_CASE(128) GDN_CASE(256)
    default: return WB_ERR_SHAPE;
  }
#undef GDN_CASE
  return (int)cudaGetLastError();
}

template <typename Acc>
int launch_chunked(const float* q, const float* k, const float* v, const float* g,
                   const float* beta, float* o, float* state, float* gcum, float* W, float* U,
                   int B, int T, int H, int HV, int K, int V, float scale, int C,
                   cudaStream_t stream) {
  constexpr int BV = 16;  // value columns per block of the sequential state pass
  const int NC = (T + C - 1) / C;
  const size_t s1 = sizeof(float) * gdn::prepare_scratch_floats(C, K, true);
  const size_t s2 = sizeof(float) * gdn::state_pass_scratch_floats(C, K, BV, true);
  const size_t s3 = sizeof(float) * gdn::output_scratch_floats(C, K, true);
  cudaError_t err;
  if ((err = allow_smem(prepare_kernel<Acc>, s1)) != cudaSuccess) return (int)err;
  if ((err = allow_smem(state_pass_kernel<Acc>, s2)) != cudaSuccess) return (int)err;
  if ((err = allow_smem(output_kernel<Acc>, s3)) != cudaSuccess) return (int)err;
  WB_LAUNCH(B * HV * NC, 256, s1, stream, prepare_kernel<Acc>)(k, v, g, beta, gcum, W, U, T, H, HV,
                                                                K, V, C, NC);
  const dim3 grid(B * HV, (V + BV - 1) / BV);
  WB_LAUNCH(grid, 128, s2, stream, state_pass_kernel<Acc>)(q, k, gcum, W, U, o, state, T, H, HV, K,
                                                           V, C, BV);
  WB_LAUNCH(B * HV * NC, 256, s3, stream, output_kernel<Acc>)(q, k, gcum, U, o, T, H, HV, K, V,
                                                              scale, C, NC);
  return (int)cudaGetLastError();
}

}  // namespace

extern "C" {

// q, k, v in in_dtype, g in g_dtype, beta in beta_dtype, o in o_dtype (GdnArgs; each 0 float32,
// 1 bf16, 2 fp16); initial state from h0, zeros (zero_state) or state itself (h0 null); the final
// state in state; qk_l2norm applied in the kernel. Returns WB_OK, a cudaError_t code,
// WB_ERR_SHAPE (K not in {16, 32, 64, 128, 256}) or WB_ERR_ARGUMENT (a dtype code out of range).
int gdn_recurrent_cuda(const GdnArgs* a) {
  for (int dt : {a->in_dtype, a->g_dtype, a->beta_dtype, a->o_dtype})
    if (dt < WB_FP32 || dt > WB_FP16) return WB_ERR_ARGUMENT;
  auto s = static_cast<cudaStream_t>(a->stream);
  return a->acc64 ? launch_recurrent<double>(a, s) : launch_recurrent<float>(a, s);
}

// gcum, W, U: float32 device workspace provided by the caller (GdnArgs). Returns WB_OK or a
// cudaError_t code.
int gdn_chunked_cuda(const GdnArgs* a) {
  if (a->chunk < 1) return WB_ERR_SHAPE;
  auto s = static_cast<cudaStream_t>(a->stream);
  const float *q = (const float*)a->q, *k = (const float*)a->k, *v = (const float*)a->v;
  float* o = (float*)a->o;
  return a->acc64 ? launch_chunked<double>(q, k, v, a->g, a->beta, o, a->state, a->gcum, a->W, a->U, a->B, a->T,
                                           a->H, a->HV, a->K, a->V, a->scale, a->chunk, s)
                  : launch_chunked<float>(q, k, v, a->g, a->beta, o, a->state, a->gcum, a->W, a->U, a->B, a->T,
                                          a->H, a->HV, a->K, a->V, a->scale, a->chunk, s);
}

}  // extern "C"

GDN_ARGS_LAYOUT
WB_DEFINE_STATUS_NAME
