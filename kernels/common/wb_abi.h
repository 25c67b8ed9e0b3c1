// The C ABI of the native kernels: named return codes, and the layout export that lets the
// Python side check its ctypes mirror of each argument struct (size and every field offset).
//
// Every entry point takes one argument struct by pointer and returns an int: WB_OK, one of the
// negative WbStatus codes below, or (CUDA builds) a positive cudaError_t. The Python mirror is
// workbench/kernels/_abi.py; tests/kernels/test_abi.py holds both sides equal.
#pragma once
#include <stddef.h>
#include <stdint.h>

// dtype codes of every buffer an entry point reads or writes; mirrored by
// workbench.numerics.dtypes.NATIVE_CODES (tests/kernels/test_abi.py holds them equal)
enum WbDtype { WB_FP32 = 0, WB_BF16 = 1, WB_FP16 = 2 };

enum WbStatus {
  WB_OK = 0,
  WB_ERR_ARGUMENT = -1,     // an argument outside what the entry point takes (dtype code, null pair)
  WB_ERR_SHAPE = -2,        // a shape the kernel does not serve (head counts, head dim, slice count)
  WB_ERR_PATH = -3,         // a code path that cannot run these operands (tensor cores on fp32)
  WB_ERR_SHARED_MEM = -4,   // the launch needs more shared memory than the device grants
};

// wb_layout_<NAME>(i): i = 0 the struct's size, i >= 1 the offset of field i - 1 (in declaration
// order), -1 past the last field.
#define WB_LAYOUT(NAME, ...)                                                          \
  extern "C" int64_t wb_layout_##NAME(int i) {                                        \
    const int64_t t[] = {(int64_t)sizeof(NAME), __VA_ARGS__};                         \
    return (i >= 0 && i < (int)(sizeof(t) / sizeof(t[0]))) ? t[i] : (int64_t)-1;     \
  }
#define WB_OFF(NAME, FIELD) (int64_t) offsetof(NAME, FIELD)

// The name of a status code, WbStatus or (in a CUDA build) cudaError_t: one definition per library.
#if defined(__CUDACC__)
#define WB_OTHER_STATUS(rc) ((rc) > 0 ? cudaGetErrorName((cudaError_t)(rc)) : "unknown status")
#else
#define WB_OTHER_STATUS(rc) "unknown status"
#endif
#define WB_DEFINE_STATUS_NAME                                 \
  extern "C" const char* wb_status_name(int rc) {             \
    switch (rc) {                                             \
      case WB_OK: return "ok";                                \
      case WB_ERR_ARGUMENT: return "WB_ERR_ARGUMENT";         \
      case WB_ERR_SHAPE: return "WB_ERR_SHAPE";               \
      case WB_ERR_PATH: return "WB_ERR_PATH";                 \
      case WB_ERR_SHARED_MEM: return "WB_ERR_SHARED_MEM";     \
      default: return WB_OTHER_STATUS(rc);                    \
    }                                                         \
  }
