// The argument struct of every GDN entry point (CPU build gdn_cpu.cpp, CUDA build gdn_cuda.cu +
// gdn_mma.cu); fields an entry point does not use are ignored. Mirrored by
// workbench/kernels/_abi.py GdnArgs (tests/kernels/test_abi.py checks size and offsets).
// Layouts, row-major: q, k [B,T,H,K]; v, o [B,T,HV,V]; g, beta [B,T,HV]; state [B,HV,K,V].
#pragma once
#include "common/wb_abi.h"

struct GdnArgs {
  const void* q;      // float32; the mma path: in_dtype (all three of q, k, v alike)
  const void* k;
  const void* v;
  const float* g;
  const float* beta;
  void* o;            // float32; the mma path: o_dtype
  float* state;       // in/out, float32
  float* gcum;        // chunked workspace, float32: gcum [B,HV,T], W [B,HV,T,K], U [B,HV,T,V]
  float* W;           //   (the mma path: tinv only)
  float* U;
  float* tinv;        // the mma path: each chunk's (I + A)^-1, P (I + A)^-1 and factor rows [B,HV,NC,gdn_mma_chunk_workspace()]
  float* nq;          // the mma path: L2-norm factors of q and k rows [B,T,H] (qk_l2norm), or both null
  float* nk;
  void* stream;       // cudaStream_t (CUDA builds)
  int B, T, H, HV, K, V;
  float scale;
  int chunk;          // chunked: tokens per chunk
  int acc64;          // 1: dot products accumulate in double
  int in_dtype;       // WbDtype of q, k, v (the mma path)
  int o_dtype;        // WbDtype of o (the mma path and the CUDA recurrence)
  // the CUDA recurrence (gdn_recurrent_cuda) also reads (h0 and zero_state: the mma path too):
  const float* h0;    // the initial state [B,HV,K,V] float32 (state is then written only), or null
  int g_dtype;        // WbDtype of g and of beta (q, k, v: in_dtype)
  int beta_dtype;
  int qk_l2norm;      // 1: the models' L2 norm of q and k rows is applied in the kernel
  int zero_state;     // 1: the initial state is zeros (h0 and state are not read)
};

#define GDN_ARGS_LAYOUT                                                                                  \
  WB_LAYOUT(GdnArgs, WB_OFF(GdnArgs, q), WB_OFF(GdnArgs, k), WB_OFF(GdnArgs, v), WB_OFF(GdnArgs, g),      \
            WB_OFF(GdnArgs, beta), WB_OFF(GdnArgs, o), WB_OFF(GdnArgs, state), WB_OFF(GdnArgs, gcum),     \
            WB_OFF(GdnArgs, W), WB_OFF(GdnArgs, U), WB_OFF(GdnArgs, tinv), WB_OFF(GdnArgs, nq),             \
            WB_OFF(GdnArgs, nk), WB_OFF(GdnArgs, stream), WB_OFF(GdnArgs, B), WB_OFF(GdnArgs, T),         \
            WB_OFF(GdnArgs, H), WB_OFF(GdnArgs, HV), WB_OFF(GdnArgs, K), WB_OFF(GdnArgs, V),              \
            WB_OFF(GdnArgs, scale), WB_OFF(GdnArgs, chunk), WB_OFF(GdnArgs, acc64),                       \
            WB_OFF(GdnArgs, in_dtype), WB_OFF(GdnArgs, o_dtype), WB_OFF(GdnArgs, h0),         \
            WB_OFF(GdnArgs, g_dtype), WB_OFF(GdnArgs, beta_dtype), WB_OFF(GdnArgs, qk_l2norm),             \
            WB_OFF(GdnArgs, zero_state))
