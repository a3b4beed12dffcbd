#include "backend/cuda/cuda_backend.h"

#include <cstdio>
#include <stdexcept>

namespace ninfer::cuda {

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorName(err) + " (" +
                             cudaGetErrorString(err) + ")");
}

DeviceInfo query_device(int ordinal) {
  int count = 0;
  check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  if (ordinal < 0 || ordinal >= count)
    throw std::runtime_error("CUDA device " + std::to_string(ordinal) + " does not exist (" +
                             std::to_string(count) + " visible)");
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, ordinal), "cudaGetDeviceProperties");
  DeviceInfo d;
  d.ordinal = ordinal;
  d.name = p.name;
  d.sm_count = p.multiProcessorCount;
  d.cc_major = p.major;
  d.cc_minor = p.minor;
  d.shared_memory_per_block_optin = p.sharedMemPerBlockOptin;
  d.total_memory = p.totalGlobalMem;
  d.cooperative_launch = p.cooperativeLaunch != 0;
  return d;
}

void guard_device(const DeviceInfo& dev, const CompiledTarget& t, bool allow_more_sms) {
  const std::string device = "GPU " + std::to_string(dev.ordinal) + " (" + dev.name + ", sm_" +
                             std::to_string(dev.cc_major) + std::to_string(dev.cc_minor) + ", " +
                             std::to_string(dev.sm_count) + " SMs)";
  const std::string target = std::string("target '") + t.name + "' (sm_" +
                             std::to_string(t.cc_major) + std::to_string(t.cc_minor) + ", " +
                             std::to_string(t.sm_count) + " SMs)";
  if (dev.cc_major != t.cc_major || dev.cc_minor != t.cc_minor)
    throw std::runtime_error(device + " does not match this server's " + target +
                             ": compute capability differs; recompile with the right --target");
  if (dev.sm_count != t.sm_count) {
    if (!allow_more_sms || dev.sm_count < t.sm_count)
      throw std::runtime_error(device + " does not match this server's " + target +
                               ": the resident-CTA budgets were proven for " +
                               std::to_string(t.sm_count) + " SMs; recompile for this GPU" +
                               (dev.sm_count > t.sm_count
                                    ? " (or pass --allow-more-sms to run with the smaller, "
                                      "still-safe budgets)"
                                    : ""));
    std::fprintf(stderr,
                 "ninfer-server: %s has more SMs than %s; running with the budgets proven "
                 "for %d SMs (nothing recomputed)\n",
                 device.c_str(), target.c_str(), t.sm_count);
  }
  if (!dev.cooperative_launch)
    throw std::runtime_error(device + " does not support cooperative launches");
}

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  check(cudaMalloc(&ptr_, bytes ? bytes : 1), "cudaMalloc");
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_) cudaFree(ptr_);
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) cudaFree(ptr_);
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void DeviceBuffer::upload(const void* host, size_t bytes, cudaStream_t stream) {
  if (bytes > bytes_) throw std::runtime_error("DeviceBuffer::upload: too many bytes");
  check(cudaMemcpyAsync(ptr_, host, bytes, cudaMemcpyHostToDevice, stream), "upload");
}

void check_launch(const LaunchBounds& b, dim3 grid, dim3 block, size_t dynamic_smem) {
  const unsigned threads = block.x * block.y * block.z;
  const unsigned long long ctas = 1ull * grid.x * grid.y * grid.z;
  auto fail = [&](const std::string& what) {
    throw std::runtime_error(std::string("launch of ") + b.kernel + " refused: " + what +
                             " (outside what the compiler verified; this is a bug in ninfer)");
  };
  if (threads == 0 || threads > b.max_threads)
    fail(std::to_string(threads) + " threads per block > " + std::to_string(b.max_threads));
  if (dynamic_smem > b.max_dynamic_smem)
    fail(std::to_string(dynamic_smem) + " bytes of shared memory > " +
         std::to_string(b.max_dynamic_smem));
  if (b.resident_budget && ctas > b.resident_budget)
    fail("cooperative grid of " + std::to_string(ctas) + " CTAs > resident budget " +
         std::to_string(b.resident_budget));
}

void configure_kernel(const void* fn, size_t dynamic_smem) {
  check(cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout,
                             cudaSharedmemCarveoutMaxShared),
        "cudaFuncSetAttribute(carveout)");
  if (dynamic_smem > 0)
    check(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(dynamic_smem)),
          "cudaFuncSetAttribute(max dynamic shared memory)");
}

}  // namespace ninfer::cuda
