// CPU backend: runs TVM-generated LLVM kernels without libtvm.
//
// Each kernel object exports `__tvm_ffi_<name>` with the packed TVM-FFI calling
// convention. The objects reference a few backend hooks (parallel launch, workspace
// allocation, error reporting) as weak function-pointer variables; cpu_backend.cpp
// defines them over our own thread pool.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include <dlpack/dlpack.h>
#include <tvm/ffi/c_api.h>

namespace ninfer::cpu {

using PackedKernel = int (*)(void* self, const TVMFFIAny* args, int32_t num_args,
                             TVMFFIAny* result);

// Threads used by parallel kernel regions (the calling thread is one of them).
void set_num_threads(int n);
int num_threads();

inline DLDataType f32() { return DLDataType{kDLFloat, 32, 1}; }
inline DLDataType i32() { return DLDataType{kDLInt, 32, 1}; }
inline DLDataType f16() { return DLDataType{kDLFloat, 16, 1}; }
inline DLDataType bf16() { return DLDataType{kDLBfloat, 16, 1}; }
inline DLDataType i8() { return DLDataType{kDLInt, 8, 1}; }
inline DLDataType u8() { return DLDataType{kDLUInt, 8, 1}; }
inline DLDataType u16() { return DLDataType{kDLUInt, 16, 1}; }

// Builds the argument list of one kernel call; storage lives in the object.
class KernelArgs {
 public:
  KernelArgs& tensor(const void* data, DLDataType dtype, std::initializer_list<int64_t> shape);
  KernelArgs& scalar(int64_t value);
  // Calls the kernel; throws std::runtime_error with TVM's message if it fails.
  void call(PackedKernel fn, const char* name);

 private:
  // The widest kernel: attention over quantized pools (q, 2 x (values, scales), pos, seq,
  // block tables, out) = 9; a stub with more arguments throws instead of overflowing.
  static constexpr int kMaxArgs = 12;
  static constexpr int kMaxDims = 4;
  void reserve_arg(const char* what);
  DLTensor tensors_[kMaxArgs]{};
  int64_t shapes_[kMaxArgs][kMaxDims]{};
  TVMFFIAny args_[kMaxArgs]{};
  int num_args_ = 0;
};

}  // namespace ninfer::cpu
