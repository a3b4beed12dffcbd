// CUDA backend pieces shared by every generated CUDA model: error checking, the device
// guard (a binary runs only on the GPU its launch budgets were proven for), device
// buffers, and launch helpers that check each launch against the compiled limits.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace ninfer::cuda {

// Throws std::runtime_error("<what>: <CUDA error string>") on failure.
void check(cudaError_t err, const char* what);

struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  int sm_count = 0;
  int cc_major = 0, cc_minor = 0;
  size_t shared_memory_per_block_optin = 0;
  size_t total_memory = 0;
  bool cooperative_launch = false;
};

DeviceInfo query_device(int ordinal);

// The compiled target's facts, baked into the generated code.
struct CompiledTarget {
  const char* name;
  int sm_count;
  int cc_major, cc_minor;
};

// Refuses a GPU whose compute capability differs from the target, or whose SM count
// differs (every resident-CTA budget was computed for target.sm_count). With
// allow_more_sms, a GPU with MORE SMs is accepted — the budgets stay safe because
// residency only grows — and a line says that nothing was recomputed.
void guard_device(const DeviceInfo& dev, const CompiledTarget& target, bool allow_more_sms);

// RAII device allocation.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) {
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }
  void upload(const void* host, size_t bytes, cudaStream_t stream);

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// A launch as the verifier saw it: the runtime re-checks it cheaply before launching,
// so a size outside what was proven fails with a message instead of a device fault.
struct LaunchBounds {
  const char* kernel;
  unsigned max_threads;      // threads per block proven
  size_t max_dynamic_smem;   // bytes proven (configure_kernel sets the opt-in attribute)
  unsigned resident_budget;  // cooperative kernels: max CTAs resident at once; else 0
};

void check_launch(const LaunchBounds& b, dim3 grid, dim3 block, size_t dynamic_smem);

// Sets cudaFuncAttributeMaxDynamicSharedMemorySize (and the max shared-memory carveout,
// which the occupancy calculation assumes) for a kernel.
void configure_kernel(const void* fn, size_t dynamic_smem);

}  // namespace ninfer::cuda
