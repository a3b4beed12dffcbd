// backend.h on CUDA: device memory on one stream; weights are uploaded from the
// mmapped artifact once; init() refuses a GPU the launch budgets were not proven for.
#include <cstdio>
#include <vector>

#include "artifact.h"
#include "backend.h"
#include "cuda_backend.h"

namespace ninfer {
namespace cuda {
// Baked into the generated launch table (launch.cu) for the compiled target.
extern const CompiledTarget kCompiledTarget;
cudaStream_t stream();
}  // namespace cuda

namespace backend {
namespace {
cuda::DeviceInfo g_device;
}

struct Arena::Impl {
  std::vector<cuda::DeviceBuffer> blocks;
  void* alloc(size_t bytes) {
    blocks.emplace_back(bytes);
    void* p = blocks.back().get();
    cuda::check(cudaMemsetAsync(p, 0, bytes, cuda::stream()), "cudaMemsetAsync");
    return p;
  }
};

Arena::Arena() : impl_(std::make_unique<Impl>()) {}
Arena::~Arena() = default;

float* Arena::floats(size_t count) { return static_cast<float*>(impl_->alloc(count * 4)); }
int32_t* Arena::ints(size_t count) { return static_cast<int32_t*>(impl_->alloc(count * 4)); }

const float* Arena::weight(const Artifact& artifact, const std::string& name,
                           const std::vector<int64_t>& shape) {
  const float* host = artifact.tensor(name, shape);
  size_t bytes = sizeof(float);
  for (int64_t d : shape) bytes *= static_cast<size_t>(d);
  float* dev = static_cast<float*>(impl_->alloc(bytes));
  cuda::check(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, cuda::stream()),
              ("upload of " + name).c_str());
  return dev;
}

void init(const Options& options) {
  g_device = cuda::query_device(0);
  cuda::guard_device(g_device, cuda::kCompiledTarget, options.allow_more_sms);
  cuda::check(cudaSetDevice(g_device.ordinal), "cudaSetDevice");
}

std::string describe() {
  return "GPU " + std::to_string(g_device.ordinal) + " (" + g_device.name + ", " +
         std::to_string(g_device.sm_count) + " SMs)";
}

void to_device(void* dst, const void* src, size_t bytes) {
  cuda::check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cuda::stream()),
              "to_device");
}

void to_host(void* dst, const void* src, size_t bytes) {
  cuda::check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cuda::stream()),
              "to_host");
}

void synchronize() { cuda::check(cudaStreamSynchronize(cuda::stream()), "synchronize"); }

}  // namespace backend
}  // namespace ninfer
