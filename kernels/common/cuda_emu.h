// A host (CPU) emulation of the CUDA subset the tensor-core kernels use, so that their source runs
// unchanged but for a few helpers on a machine without a GPU, for tests: every CUDA thread of a
// block is a fiber (ucontext) of one OS thread, scheduled round robin; a fiber runs until it
// reaches a barrier or a warp-collective instruction and yields there until its peers arrive.
//
// What it models (and the kernels rely on):
//   __syncthreads, named barriers (bar.sync id, n; bar.arrive id, n), __syncwarp, warp shuffles,
//   wgmma (m64nNk8 tf32 and m64nNk16 bf16, A from registers, B by shared-memory descriptor;
//   below), mma.sync m16n8k8 tf32 (the PTX fragment layouts; operands' low 13 bits ignored as the tensor cores do; the
//   eight products, exact in float32, added to the accumulator one by one in k order in float32:
//   deterministic and order-sensitive like the hardware, though not its rounding), ldmatrix .x4
//   (and .trans), cvt.rna.tf32.f32, cp.async with groups (WB_EMU_CP=late, the default: a copy
//   lands when its thread waits for its group, so a read before the wait sees the old bytes;
//   =eager: at issue, so a copy into a buffer still being read corrupts it: two legal extremes of
//   the asynchronous copy), dynamic shared memory (filled with NaN at each block's start, so reads
//   of unwritten shared memory show), blocks one after another.
// What it does not: memory-model subtleties beyond barrier order, bank conflicts, timing, device
// math library roundings (host expf and sqrtf), shared-memory limits (the kernels' static asserts
// check those at compile time).
// Failures (a barrier some threads never reach, a warp whose lanes part at a collective) end the
// launch; cudaGetLastError() then returns cudaErrorLaunchFailure and wb_emu_last_failure() says
// why.
#pragma once
// (common/mma_ops.h: the host models of the mma wrappers where this header is in)
#define WB_CUDA_EMU 1

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

// ------------------------------------------------------------------- CUDA keywords and types

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)

struct float2 {
  float x, y;
};
struct float4 {
  float x, y, z, w;
};
struct uint4 {
  unsigned x, y, z, w;
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
inline float2 make_float2(float x, float y) { return float2{x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x, y, z;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};

inline unsigned __float_as_uint(float f) {
  unsigned u;
  memcpy(&u, &f, 4);
  return u;
}
inline float __uint_as_float(unsigned u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// bf16 and fp16 storage types (2 bytes, as torch's), rounded to nearest even from float32
struct __nv_bfloat16 {
  uint16_t r;
};
struct __half {
  uint16_t r;
};
struct __nv_bfloat162 {
  __nv_bfloat16 x, y;
};
struct __half2 {
  __half x, y;
};
static_assert(sizeof(__nv_bfloat16) == 2 && sizeof(__half) == 2 && sizeof(__nv_bfloat162) == 4,
              "16-bit storage types");
inline float __bfloat162float(__nv_bfloat16 b) { return __uint_as_float((unsigned)b.r << 16); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return __nv_bfloat16{(uint16_t)((u >> 16) | 0x40u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return __nv_bfloat16{(uint16_t)(u >> 16)};
}
#if defined(__FLT16_MAX__)  // the compiler's own binary16 (g++ >= 12 on x86-64)
inline float __half2float(__half h) {
  _Float16 x;
  memcpy(&x, &h.r, 2);
  return (float)x;
}
inline __half __float2half_rn(float f) {
  const _Float16 x = (_Float16)f;
  __half h;
  memcpy(&h.r, &x, 2);
  return h;
}
#else  // by hand: binary16 from and to float32, to nearest even, subnormals, inf and nan
inline float __half2float(__half h) {
  const uint32_t sign = (uint32_t)(h.r & 0x8000u) << 16, e = (h.r >> 10) & 0x1fu, m = h.r & 0x3ffu;
  if (e == 0x1f) return __uint_as_float(sign | 0x7f800000u | (m << 13));
  if (e == 0) return sign ? -ldexpf((float)m, -24) : ldexpf((float)m, -24);
  return __uint_as_float(sign | ((e + 112) << 23) | (m << 13));
}
inline __half __float2half_rn(float f) {
  const uint32_t u = __float_as_uint(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return __half{(uint16_t)(sign | 0x7e00u)};  // nan
  if (a >= 0x477ff000u) return __half{(uint16_t)(sign | 0x7c00u)};  // rounds to inf
  if (a < 0x38800000u) {  // a subnormal half (or zero): in units of 2^-24, to nearest even
    const float q = __uint_as_float(a) * 16777216.0f;  // exact: a power-of-two scale
    return __half{(uint16_t)(sign | (uint32_t)nearbyintf(q))};
  }
  uint32_t r = a + 0xfffu + ((a >> 13) & 1u);  // to nearest even at bit 13
  return __half{(uint16_t)(sign | ((r - 0x38000000u) >> 13))};
}
#endif
inline __half __ushort_as_half(unsigned short u) { return __half{u}; }
inline float2 __bfloat1622float2(__nv_bfloat162 p) {
  return make_float2(__bfloat162float(p.x), __bfloat162float(p.y));
}
inline float2 __half22float2(__half2 p) {
  return make_float2(__half2float(p.x), __half2float(p.y));
}
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
  return __nv_bfloat162{__float2bfloat16_rn(a), __float2bfloat16_rn(b)};
}
inline __half2 __floats2half2_rn(float a, float b) {
  return __half2{__float2half_rn(a), __float2half_rn(b)};
}

// ------------------------------------------------------------------------- runtime API subset

typedef int cudaError_t;
enum : int { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorLaunchFailure = 719 };
typedef void* cudaStream_t;
enum cudaFuncAttribute {
  cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
  cudaFuncAttributePreferredSharedMemoryCarveout = 9
};
enum cudaSharedCarveout { cudaSharedmemCarveoutMaxShared = 100 };
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16 };

namespace wbemu {

// ------------------------------------------------------------------------ fibers and barriers

struct Barrier {
  int expected = 0, arrived = 0;
  unsigned gen = 0;
};

struct Copy {
  void* dst;
  const void* src;
  int bytes;
};

// One thread's part of a wgmma.mma_async: its accumulator registers (performed at the wait, so
// the registers change there: a read before the wait sees the old values), its A fragment (read
// at issue) and the B descriptor; kind 0 tf32 (m64nNk8), 1 bf16 (m64nNk16), 2 bf16 with B
// MN-major (the transpose flag).
struct WgOp {
  float* d;
  int n, kind;
  bool scale_d;
  uint32_t a[4];
  uint64_t desc;
};

struct Fiber {
  ucontext_t ctx;
  std::vector<char> stack;
  bool done = false;
  std::vector<Copy> pending;  // issued, not yet landed (WB_EMU_CP=late)
  std::vector<size_t> groups;  // pending.size() at each commit
  std::vector<struct WgOp> wg_ops;  // wgmma.mma_async issued, not yet waited for
  std::vector<size_t> wg_groups;    // wg_ops.size() at each wgmma.commit_group
};

constexpr int kMaxWarps = 32, kWords = 16;

struct Block {
  uint3 bidx{0, 0, 0}, bdim{1, 1, 1}, gdim{1, 1, 1};
  int nthreads = 0, current = 0;
  std::vector<Fiber>* fibers = nullptr;
  ucontext_t sched;
  std::vector<float4> smem;
  Barrier block_bar, named[16], warp_bar[kMaxWarps], syncwarp_bar[kMaxWarps], wg_bar[kMaxWarps / 4];
  uint32_t stage[kMaxWarps][32][kWords];  // warp collectives: each lane's deposit
  const std::function<void()>* body = nullptr;
  unsigned long events = 0;  // barrier arrivals and releases, finished threads: progress
  bool failed = false;
  std::string why;
};

inline Block*& cur() {
  static thread_local Block* b = nullptr;
  return b;
}
inline std::string& last_failure() {
  static thread_local std::string s;
  return s;
}
inline cudaError_t& last_error() {
  static thread_local cudaError_t e = cudaSuccess;
  return e;
}
inline bool eager_copies() {
  const char* e = getenv("WB_EMU_CP");
  return e && !strcmp(e, "eager");
}
inline bool skewed() {
  const char* e = getenv("WB_EMU_SCHED");
  return e && !strcmp(e, "skew");
}

inline void yield() {
  Block* b = cur();
  swapcontext(&(*b->fibers)[b->current].ctx, &b->sched);
}

inline void fail(Block* b, const std::string& why) {
  if (!b->failed) b->failed = true, b->why = why;
  for (;;) yield();  // the scheduler stops resuming a failed block's threads
}

// Arrive at bar (expected threads), releasing it if this is the last arrival; returns the
// generation arrived in (bar.gen moves past it once the barrier is released).
inline unsigned arrive(Barrier& bar, int expected, const char* what) {
  Block* b = cur();
  if (bar.arrived == 0) bar.expected = expected;
  else if (bar.expected != expected)
    fail(b, std::string(what) + ": threads arrive with different counts");
  const unsigned gen = bar.gen;
  ++b->events;
  if (++bar.arrived == bar.expected) {
    bar.arrived = 0;
    ++bar.gen;
  }
  return gen;
}

// Arrive at bar (expected threads) and wait until the expected number arrived.
inline void arrive_wait(Barrier& bar, int expected, const char* what) {
  const unsigned gen = arrive(bar, expected, what);
  while (bar.gen == gen) yield();
}

inline int tid_linear() {
  Block* b = cur();
  return b->current;
}

// A warp collective: this lane's n words go to the warp's stage; once every lane of the warp has
// deposited, f(stage) gives this lane's result; the lanes then meet again before the stage is
// reused. Every lane of the warp must take part (the kernels' collectives are warp-uniform).
template <typename F>
inline auto warp_collective(const uint32_t* words, int n, F&& f) {
  Block* b = cur();
  const int t = b->current, w = t / 32, lane = t % 32;
  memcpy(b->stage[w][lane], words, sizeof(uint32_t) * n);
  arrive_wait(b->warp_bar[w], 32, "warp collective");
  auto r = f(b->stage[w], lane);
  arrive_wait(b->warp_bar[w], 32, "warp collective");
  return r;
}

inline void land(Fiber& f, size_t upto) {
  for (size_t i = 0; i < upto; ++i) memcpy(f.pending[i].dst, f.pending[i].src, f.pending[i].bytes);
  f.pending.erase(f.pending.begin(), f.pending.begin() + upto);
  for (size_t& g : f.groups) g = g > upto ? g - upto : 0;
}

// ------------------------------------------------------------------------------ the launches

inline void trampoline() {
  Block* b = cur();
  (*b->body)();
  Fiber& f = (*b->fibers)[b->current];
  land(f, f.pending.size());  // copies never waited for still land (they did on the device)
  if (!f.wg_ops.empty()) fail(b, "wgmma.mma_async issued and never waited for (wgmma.wait_group)");
  f.done = true;
  ++b->events;
  // returning resumes uc_link: the scheduler
}

// Run body on every thread of every block of grid x block, dynamic shared memory of smem bytes.
inline cudaError_t run_grid(dim3 grid, dim3 block, size_t smem, const std::function<void()>& body) {
  const int nt = (int)(block.x * block.y * block.z);
  if (nt < 1 || nt > 32 * kMaxWarps || nt % 32) {
    last_failure() = "block of " + std::to_string(nt) +
                     " threads (the emulation takes whole warps, up to 1024)";
    return last_error() = cudaErrorInvalidValue;
  }
  static thread_local std::vector<Fiber> fibers;
  constexpr size_t kStack = 256 * 1024;
  if ((int)fibers.size() < nt) fibers.resize(nt);
  for (int i = 0; i < nt; ++i)
    if (fibers[i].stack.size() < kStack) fibers[i].stack.assign(kStack, 0);
  Block* saved = cur();
  for (unsigned by = 0; by < grid.y; ++by)
    for (unsigned bx = 0; bx < grid.x; ++bx) {
      Block* b = new Block();
      b->bidx = uint3{bx, by, 0};
      b->bdim = uint3{block.x, block.y, block.z};
      b->gdim = uint3{grid.x, grid.y, grid.z};
      b->nthreads = nt;
      b->fibers = &fibers;
      b->body = &body;
      b->smem.assign((smem + sizeof(float4) - 1) / sizeof(float4) + 1,
                     float4{NAN, NAN, NAN, NAN});
      cur() = b;
      for (int i = 0; i < nt; ++i) {
        Fiber& f = fibers[i];
        f.done = false;
        f.pending.clear();
        f.groups.clear();
        f.wg_ops.clear();
        f.wg_groups.clear();
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = f.stack.data();
        f.ctx.uc_stack.ss_size = f.stack.size();
        f.ctx.uc_link = &b->sched;
        makecontext(&f.ctx, trampoline, 0);
      }
      const bool skew = skewed();
      unsigned long before = b->events;
      for (unsigned round = 1;; ++round) {
        bool live = false;
        for (int i = 0; i < nt && !b->failed; ++i) {
          if (fibers[i].done) continue;
          live = true;
          // skewed: warp w runs every (w % 3 + 1)-th round, so warps drift apart between barriers
          if (skew && round % ((i / 32) % 3 + 1)) continue;
          b->current = i;
          swapcontext(&b->sched, &fibers[i].ctx);
        }
        if (b->failed || !live) break;
        if (skew && round % 6) continue;  // every thread has run since the last check
        if (b->events != before) {
          before = b->events;
          continue;
        }
        {  // every live thread waits and none can release another
          int done = 0;
          for (int i = 0; i < nt; ++i) done += fibers[i].done;
          b->failed = true;
          b->why = "deadlock: " + std::to_string(nt - done) + " of " + std::to_string(nt) +
                   " threads wait at barriers no other thread will reach";
          break;
        }
      }
      for (int id = 1; id < 16 && !b->failed; ++id)
        if (b->named[id].arrived)
          b->failed = true, b->why = "barrier " + std::to_string(id) + " left with " +
                                     std::to_string(b->named[id].arrived) + " of " +
                                     std::to_string(b->named[id].expected) + " arrivals";
      const bool failed = b->failed;
      if (failed) {
        last_failure() = "block (" + std::to_string(bx) + ", " + std::to_string(by) + "): " + b->why;
        last_error() = cudaErrorLaunchFailure;
      }
      delete b;  // a failed block's fibers are abandoned mid-way (their stacks are reused)
      if (failed) {
        cur() = saved;
        return cudaErrorLaunchFailure;
      }
    }
  cur() = saved;
  return cudaSuccess;
}

template <typename K>
struct Launch {
  K* kernel;
  dim3 grid, block;
  size_t smem;
  template <typename... A>
  void operator()(A... args) const {
    if (last_error() != cudaSuccess) return;  // an earlier launch failed: the stream stops there
    K* k = kernel;
    const std::function<void()> body = [&]() { k(args...); };
    run_grid(grid, block, smem, body);
  }
};

template <typename T>
inline T* dynamic_smem() {
  return reinterpret_cast<T*>(cur()->smem.data());
}

// ---------------------------------------------------------------------- the PTX the kernels use

// cvt.rna.tf32.f32: to nearest, ties away from zero, 10 mantissa bits (low 13 bits cleared)
inline uint32_t cvt_rna_tf32(float x) {
  uint32_t u = __float_as_uint(x);
  if ((u & 0x7f800000u) == 0x7f800000u) return u;  // inf, nan as they are
  return (u + 0x1000u) & 0xffffe000u;
}

// One m16n8 mma of depth KD for this lane: d += a b, the warp's A and B fragments (a0-a3 in
// words 0-3, b0, b1 in words 4, 5 of each lane's deposit) read through A(st, row, k) and
// B(st, k, n); d's fragment as the PTX ISA's m16n8 tables: c0 (g, 2t), c1 (g, 2t + 1),
// c2 (g + 8, 2t), c3 (g + 8, 2t + 1); g = lane / 4, t = lane % 4. Each product is exact in float32
// (the operands' significands are short enough), added to the accumulator in k order.
template <int KD, typename FA, typename FB>
inline void mma_m16n8(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, FA&& A,
                      FB&& B) {
  uint32_t w[6] = {a[0], a[1], a[2], a[3], b0, b1};
  struct R {
    float v[4];
  };
  const float c[4] = {d[0], d[1], d[2], d[3]};
  R r = warp_collective(w, 6, [&](uint32_t (*st)[kWords], int lane) {
    const int g = lane / 4, t = lane % 4;
    R out;
    for (int e = 0; e < 4; ++e) {
      const int row = g + 8 * (e / 2), col = 2 * t + (e % 2);
      float acc = c[e];
      for (int k = 0; k < KD; ++k) acc += A(st, row, k) * B(st, k, col);
      out.v[e] = acc;
    }
    return out;
  });
  for (int e = 0; e < 4; ++e) d[e] = r.v[e];
}

// mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32, d += a b for this lane's fragments:
// a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4); b0 (k t, n g), b1 (k t + 4, n g);
// the operands' low 13 bits ignored (tf32), not rounded; products of two 11-bit significands.
inline void mma_m16n8k8_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  auto opnd = [](uint32_t x) { return __uint_as_float(x & 0xffffe000u); };
  mma_m16n8<8>(
      d, a, b0, b1,
      [&](uint32_t (*st)[kWords], int row, int k) {  // row 0..15, k 0..7
        const int g = row % 8, t = k % 4, slot = (row >= 8 ? 1 : 0) + (k >= 4 ? 2 : 0);
        return opnd(st[4 * g + t][slot]);
      },
      [&](uint32_t (*st)[kWords], int k, int n) { return opnd(st[4 * n + (k % 4)][k >= 4 ? 5 : 4]); });
}

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, d += a b for this lane's fragments, each
// register two bf16 (the lower k or column in the low half): a0 (g, 2t..2t+1), a1 (g + 8, 2t..),
// a2 (g, 2t + 8..), a3 (g + 8, 2t + 8..); b0 (k 2t..2t+1, n g), b1 (k 2t + 8..2t + 9, n g);
// products of two 8-bit significands. (Not used by a kernel yet: the bf16 form of the GDN pass,
// docs/kernels/gdn.md "Not done / next steps", is to be built on it.)
inline void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  auto half = [](uint32_t x, int hi) { return __uint_as_float((hi ? x >> 16 : x & 0xffffu) << 16); };
  mma_m16n8<16>(
      d, a, b0, b1,
      [&](uint32_t (*st)[kWords], int row, int k) {  // row 0..15, k 0..15
        const int g = row % 8, t = (k % 8) / 2, slot = (row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0);
        return half(st[4 * g + t][slot], k % 2);
      },
      [&](uint32_t (*st)[kWords], int k, int n) {
        return half(st[4 * n + (k % 8) / 2][k >= 8 ? 5 : 4], k % 2);
      });
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lane l gives the row address of tile l / 8,
// row l % 8 (16 bytes); r[m] holds tile m's elements (row g, columns 2t, 2t + 1) (TRANS: of the
// transposed tile: the tile's rows 2t, 2t + 1 at column g), the lower column in the low half.
template <bool TRANS>
inline void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
  uint32_t w[2];
  const uintptr_t p = (uintptr_t)row;
  w[0] = (uint32_t)p;
  w[1] = (uint32_t)((uint64_t)p >> 32);
  struct R {
    uint32_t v[4];
  };
  R out = warp_collective(w, 2, [&](uint32_t (*st)[kWords], int lane) {
    auto addr = [&](int l) {
      return (const uint16_t*)(uintptr_t)(((uint64_t)st[l][1] << 32) | st[l][0]);
    };
    const int g = lane / 4, t = lane % 4;
    R o;
    for (int m = 0; m < 4; ++m) {
      uint16_t lo, hi;
      if (TRANS) {
        lo = addr(8 * m + 2 * t)[g];
        hi = addr(8 * m + 2 * t + 1)[g];
      } else {
        lo = addr(8 * m + g)[2 * t];
        hi = addr(8 * m + g)[2 * t + 1];
      }
      o.v[m] = (uint32_t)lo | ((uint32_t)hi << 16);
    }
    return o;
  });
  for (int m = 0; m < 4; ++m) r[m] = out.v[m];
}

inline void cp_async(void* dst, const void* src, int bytes) {
  Block* b = cur();
  if (eager_copies()) {
    memcpy(dst, src, bytes);
    return;
  }
  (*b->fibers)[b->current].pending.push_back(Copy{dst, src, bytes});
}
inline void cp_async_commit() {
  Block* b = cur();
  Fiber& f = (*b->fibers)[b->current];
  f.groups.push_back(f.pending.size());
}
// cp.async.wait_group n: every group but the n most recent committed ones has landed
inline void cp_async_wait(int n) {
  Block* b = cur();
  Fiber& f = (*b->fibers)[b->current];
  if ((int)f.groups.size() <= n) return;
  const size_t upto = f.groups[f.groups.size() - 1 - n];
  land(f, upto);
  f.groups.erase(f.groups.begin(), f.groups.end() - n);
}

// ------------------------------------------------- wgmma (warpgroup MMA, sm_90a), the host model
//
// wgmma.mma_async.sync.aligned.m64nNk8.f32.tf32.tf32 and .m64nNk16.f32.bf16.bf16 with A from
// registers and B from shared memory through a matrix descriptor, K-major (the layout tf32
// requires; bf16 without transpose), per the PTX ISA:
//   the descriptor: bits 0-13 the start address >> 4, 16-29 the leading byte offset (LBO) >> 4,
//   32-45 the stride byte offset (SBO) >> 4, 62-63 the swizzle (0 none, 1 128-byte, 2 64-byte,
//   3 32-byte); the base-offset bits 49-51 must be 0 (the model fails otherwise).
//   B's element (k, n), e bytes each, 16 / e of them (one 16-byte piece) a core-matrix row: rows
//   are n, in core matrices of 8 rows SBO apart (n / 8); the instruction's 32 bytes of k are two
//   pieces: without swizzle, a core matrix is 8 rows of 16 bytes (row n % 8 at 16 (n % 8)) and the
//   second piece is LBO away; with a W-byte swizzle (W = 32, 64, 128) a row is W bytes (row n % 8
//   at W (n % 8), the second piece 16 bytes on) and the byte address's bits 4.. are XORed with its
//   bits 7.. (as many bits as W / 16 - 1 has): addr ^= ((addr >> 7) & (W / 16 - 1)) << 4. The
//   address is the shared-memory one (here: from the block's dynamic shared memory's start, which
//   stands for a 1024-byte aligned base).
//   bf16 with the transpose flag (kind 2): B MN-major, n contiguous, per the ISA's MN-major
//   canonical layouts: without swizzle a core matrix is 8 rows of k, each 16 bytes of n, the next
//   16 bytes of n SBO away and the next 8 rows of k LBO away; with a W-byte swizzle a row of k is W
//   bytes of n, W-byte atoms of n LBO apart, groups of 8 rows of k SBO apart, the same XOR. (Not
//   yet checked against the tensor cores: its GPU probe layouts are in test_cuda_emu.py.)
//   A's fragment (per warp w of the warpgroup, rows 16 w .. 16 w + 15) is mma.sync's m16n8k8 tf32
//   (m16n8k16 bf16) A fragment; D's: register i of lane (g, t) of warp w is row
//   16 w + g + 8 ((i / 2) % 2), column 8 (i / 4) + 2 t + i % 2.
// The arithmetic is mma_m16n8's: the products exact in float32, added to the accumulator in k
// order (scale_d false: to zero). The instruction is asynchronous: the model reads A at issue and
// B and the accumulators at the wgmma.wait_group that covers it, where it writes D, so shared
// memory overwritten, or accumulators read, before that wait show.

inline int wg_of(int t) { return t / 128; }

inline uint32_t smem_offset(const void* p) {
  Block* b = cur();
  const char* base = reinterpret_cast<const char*>(b->smem.data());
  const char* q = reinterpret_cast<const char*>(p);
  if (q < base || q >= base + b->smem.size() * sizeof(float4))
    fail(b, "a shared-memory address outside the block's dynamic shared memory");
  return (uint32_t)(q - base);
}

// A matrix descriptor's fields, decoded once an operation
struct WgDesc {
  uint32_t start, lbo, sbo;
  int W;  // swizzle bytes: 0 none, 32, 64, 128
  explicit WgDesc(uint64_t desc)
      : start((uint32_t)(desc & 0x3fff) << 4), lbo((uint32_t)((desc >> 16) & 0x3fff) << 4),
        sbo((uint32_t)((desc >> 32) & 0x3fff) << 4) {
    const int mode = (int)(desc >> 62);
    W = mode == 1 ? 128 : mode == 2 ? 64 : mode == 3 ? 32 : 0;
  }
};

// B's element (k, n) through descriptor dc, e bytes an element (4 tf32, 2 bf16), as float; mn:
// B MN-major (bf16's transpose flag), else K-major
inline float wg_b(const WgDesc& dc, int e, int k, int n, bool mn = false) {
  Block* b = cur();
  const uint32_t lbo = dc.lbo, sbo = dc.sbo;
  const int W = dc.W, per = 16 / e;
  uint32_t addr = dc.start;
  if (!mn) {
    addr += (uint32_t)(n / 8) * sbo + (uint32_t)(k % per) * e;
    if (W == 0) addr += (uint32_t)(n % 8) * 16 + (uint32_t)(k / per) * lbo;
    else addr += (uint32_t)(n % 8) * W + (uint32_t)(k / per) * 16;
  } else {  // n contiguous: 16-byte pieces of n; rows k, in groups of 8
    addr += (uint32_t)(n % per) * e;
    if (W == 0) {  // core matrix: 8 rows k of 16 bytes; pieces of n SBO apart, groups of k LBO
      addr += (uint32_t)(k % 8) * 16 + (uint32_t)(n / per) * sbo + (uint32_t)(k / 8) * lbo;
    } else {  // a row k is W bytes of n (W / 16 pieces); W-byte atoms of n LBO apart, groups of k SBO
      const int pieces = W / 16;
      addr += (uint32_t)((n / per) % pieces) * 16 + (uint32_t)(n / (per * pieces)) * lbo +
              (uint32_t)(k % 8) * W + (uint32_t)(k / 8) * sbo;
    }
  }
  if (W != 0) addr ^= ((addr >> 7) & (uint32_t)(W / 16 - 1)) << 4;
  if (addr + e > b->smem.size() * sizeof(float4))
    fail(b, "wgmma: a B element's address past the block's dynamic shared memory");
  const char* p = reinterpret_cast<const char*>(b->smem.data()) + addr;
  if (e == 4) {
    uint32_t u;
    memcpy(&u, p, 4);
    return __uint_as_float(u & 0xffffe000u);  // tf32: the low 13 bits ignored
  }
  uint16_t h;
  memcpy(&h, p, 2);
  return __uint_as_float((uint32_t)h << 16);
}

// wgmma.mma_async (A from registers): this thread's part, performed at the covering wait
template <int N>
inline void wgmma_issue(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc, bool scale_d, int kind) {
  static_assert(N % 8 == 0 && N >= 8 && N <= 256, "wgmma's N: 8 .. 256 in steps of 8");
  Block* b = cur();
  if ((desc >> 49) & 7) fail(b, "wgmma: a descriptor with a base offset (the model takes 0)");
  WgOp op{d, N, kind, scale_d, {a[0], a[1], a[2], a[3]}, desc};
  (*b->fibers)[b->current].wg_ops.push_back(op);
}

inline void wgmma_commit() {
  Block* b = cur();
  Fiber& f = (*b->fibers)[b->current];
  f.wg_groups.push_back(f.wg_ops.size());
}

// wgmma.wait_group n: the warpgroup's operations of every group but the n most recent committed
// ones are performed (a warpgroup collective: its 128 threads take part, with the same operations)
inline void wgmma_wait(int n) {
  Block* b = cur();
  const int t = b->current, w0 = wg_of(t) * 128, me = t - w0;
  if (w0 + 128 > b->nthreads) fail(b, "wgmma: a warpgroup of fewer than 128 threads");
  Fiber& f = (*b->fibers)[t];
  const size_t upto = (int)f.wg_groups.size() <= n ? 0 : f.wg_groups[f.wg_groups.size() - 1 - n];
  arrive_wait(b->wg_bar[wg_of(t)], 128, "wgmma.wait_group");
  for (size_t i = 0; i < upto; ++i) {
    const WgOp& op = f.wg_ops[i];
    for (int th = 0; th < 128; ++th) {  // the warpgroup's threads issued the same operation
      const Fiber& g = (*b->fibers)[w0 + th];
      if (g.wg_ops.size() <= i || g.wg_ops[i].desc != op.desc || g.wg_ops[i].n != op.n ||
          g.wg_ops[i].kind != op.kind || g.wg_ops[i].scale_d != op.scale_d)
        fail(b, "wgmma: the warpgroup's threads issued different operations");
    }
    auto peer = [&](int th) -> const WgOp& { return (*b->fibers)[w0 + th].wg_ops[i]; };
    const WgDesc dc(op.desc);
    const int e = op.kind == 0 ? 4 : 2, KD = op.kind == 0 ? 8 : 16;
    const bool mn = op.kind == 2;  // bf16 with B MN-major
    // A (m, k) from the fragment of the lane that holds it
    auto A = [&](int m, int k) {
      const int w = m / 16, r = m % 16, g = r % 8;
      if (op.kind == 0) {
        const uint32_t x = peer(32 * w + 4 * g + k % 4).a[(r >= 8 ? 1 : 0) + (k >= 4 ? 2 : 0)];
        return __uint_as_float(x & 0xffffe000u);
      }
      const uint32_t x = peer(32 * w + 4 * g + (k % 8) / 2).a[(r >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)];
      return __uint_as_float((k % 2 ? x >> 16 : x & 0xffffu) << 16);
    };
    // this thread's registers r = 4 j + 2 h + p: row 16 w + g + 8 h, column 8 j + 2 tq + p; the
    // two rows' A read once, each column's B once for both rows (sums in k order, as before)
    const int w = me / 32, g = (me % 32) / 4, tq = me % 4;
    float am[2][16];
    for (int h = 0; h < 2; ++h)
      for (int k = 0; k < KD; ++k) am[h][k] = A(16 * w + g + 8 * h, k);
    for (int j = 0; j < op.n / 8; ++j)
      for (int p = 0; p < 2; ++p) {
        const int r0 = 4 * j + p, r1 = r0 + 2, col = 8 * j + 2 * tq + p;
        float acc0 = op.scale_d ? op.d[r0] : 0.0f, acc1 = op.scale_d ? op.d[r1] : 0.0f;
        for (int k = 0; k < KD; ++k) {
          const float bk = wg_b(dc, e, k, col, mn);
          acc0 += am[0][k] * bk;
          acc1 += am[1][k] * bk;
        }
        op.d[r0] = acc0, op.d[r1] = acc1;
      }
  }
  // every thread has read its peers' fragments before they drop their operations
  arrive_wait(b->wg_bar[wg_of(t)], 128, "wgmma.wait_group");
  f.wg_ops.erase(f.wg_ops.begin(), f.wg_ops.begin() + upto);
  std::vector<size_t> left;  // the groups not yet performed, counted from the ops left
  for (size_t g : f.wg_groups)
    if (g > upto) left.push_back(g - upto);
  f.wg_groups.swap(left);
}

// The barrier of bar.sync / bar.arrive id, count (what), checked: ids 0-15 (0, the block's, only
// for bar.sync), whole warps, at most the block's threads.
inline Barrier& named(int id, int count, bool arrive_only, const char* what) {
  Block* b = cur();
  if (id < (arrive_only ? 1 : 0) || id >= 16 || count % 32 || count < 32 || count > b->nthreads)
    fail(b, std::string(what) + " " + std::to_string(id) + ", " + std::to_string(count) +
                ": not a valid barrier");
  return id == 0 ? b->block_bar : b->named[id];
}

inline void named_barrier(int id, int count) {
  arrive_wait(named(id, count, false, "bar.sync"), count, "bar.sync");
}

// bar.arrive id, count: this thread's arrival without waiting (a producer's signal); the barrier
// completes, releasing the threads waiting at it by bar.sync, once count threads have arrived
// either way. A block that ends with arrivals pending at a barrier fails (run_grid): the kernels'
// protocols are to balance every arrival.
inline void named_arrive(int id, int count) {
  arrive(named(id, count, true, "bar.arrive"), count, "bar.arrive");
}

}  // namespace wbemu

#define threadIdx (::wbemu::uint3_of(::wbemu::cur()->current, ::wbemu::cur()->bdim))
#define blockIdx (::wbemu::cur()->bidx)
#define blockDim (::wbemu::cur()->bdim)
#define gridDim (::wbemu::cur()->gdim)
namespace wbemu {
inline uint3 uint3_of(int t, uint3 d) {
  return uint3{(unsigned)(t % d.x), (unsigned)(t / d.x % d.y), (unsigned)(t / (d.x * d.y))};
}
}  // namespace wbemu

inline void __syncthreads() {
  ::wbemu::Block* b = ::wbemu::cur();
  ::wbemu::arrive_wait(b->block_bar, b->nthreads, "__syncthreads");
}
inline void __syncwarp(unsigned = 0xffffffffu) {
  ::wbemu::Block* b = ::wbemu::cur();
  ::wbemu::arrive_wait(b->syncwarp_bar[b->current / 32], 32, "__syncwarp");
}
inline float __shfl_xor_sync(unsigned, float v, int off) {
  const uint32_t w = __float_as_uint(v);
  return ::wbemu::warp_collective(&w, 1, [&](uint32_t (*st)[::wbemu::kWords], int lane) {
    return __uint_as_float(st[(lane ^ off) & 31][0]);
  });
}
inline float __shfl_up_sync(unsigned, float v, int off) {
  const uint32_t w = __float_as_uint(v);
  return ::wbemu::warp_collective(&w, 1, [&](uint32_t (*st)[::wbemu::kWords], int lane) {
    return lane >= off ? __uint_as_float(st[lane - off][0]) : __uint_as_float(st[lane][0]);
  });
}

template <typename F>
inline cudaError_t cudaFuncSetAttribute(F*, cudaFuncAttribute, int) {
  return cudaSuccess;
}
inline cudaError_t cudaGetDevice(int* d) {
  *d = 0;
  return cudaSuccess;
}
// The SMs of the emulated device: WB_EMU_SMS, else 132 (an H100 SXM / H200); the launchers'
// choices of pass and block depend on it.
inline cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr, int) {
  const char* e = getenv("WB_EMU_SMS");
  *v = e && atoi(e) > 0 ? atoi(e) : 132;
  return cudaSuccess;
}
inline cudaError_t cudaGetLastError() {
  const cudaError_t e = ::wbemu::last_error();
  ::wbemu::last_error() = cudaSuccess;
  return e;
}

// kernel<<<g, b, m, s>>>(args): WB_LAUNCH(g, b, m, s, kernel)(args)
#define WB_LAUNCH(g, b, m, s, ...) (::wbemu::Launch<std::remove_reference_t<decltype(__VA_ARGS__)>>{ \
    &__VA_ARGS__, dim3(g), dim3(b), (size_t)(m)})
#define WB_DYNAMIC_SMEM(T, name) T* name = ::wbemu::dynamic_smem<T>()
