// backend/backend.h on CUDA: device memory on one stream; weights are uploaded from the
// mmapped artifact once; init() refuses a GPU the launch budgets were not proven for.
#include <atomic>
#include <cstdio>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "model/artifact.h"

namespace ninfer {
namespace cuda {
// Baked into the generated launch table (launch.cu) for the compiled target.
extern const CompiledTarget kCompiledTarget;
cudaStream_t stream();
}  // namespace cuda

namespace backend {
namespace {
cuda::DeviceInfo g_device;
bool g_graphs = true;
}  // namespace

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
void* Arena::bytes(size_t count) { return impl_->alloc(count); }

const void* Arena::weight(const Artifact& artifact, const std::string& name,
                          const std::string& dtype, const std::vector<int64_t>& shape) {
  const void* host = artifact.tensor(name, dtype, shape);
  size_t bytes = dtype == "f32" ? 4 : dtype == "f16" || dtype == "bf16" ? 2 : 1;
  for (int64_t d : shape) bytes *= static_cast<size_t>(d);
  void* dev = impl_->alloc(bytes);
  cuda::check(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, cuda::stream()),
              ("upload of " + name).c_str());
  return dev;
}

const float* Arena::weight(const Artifact& artifact, const std::string& name,
                           const std::vector<int64_t>& shape) {
  return static_cast<const float*>(weight(artifact, name, "f32", shape));
}

void init(const Options& options) {
  g_device = cuda::query_device(0);
  cuda::guard_device(g_device, cuda::kCompiledTarget, options.allow_more_sms);
  cuda::check(cudaSetDevice(g_device.ordinal), "cudaSetDevice");
  g_graphs = options.graphs;
}

bool graphs_enabled() { return g_graphs; }

namespace {
std::atomic<uint64_t> g_captured{0}, g_replays{0};
}  // namespace

GraphCounts graph_counts() { return {true, g_captured.load(), g_replays.load()}; }

struct StepGraphs::Impl {
  struct Entry {
    int runs = 0;
    cudaGraphExec_t exec = nullptr;
    bool eager = false;  // capture failed once: this key stays eager
  };
  std::unordered_map<uint64_t, Entry> entries;
  size_t captured = 0;
  ~Impl() {
    for (auto& [key, e] : entries)
      if (e.exec) cudaGraphExecDestroy(e.exec);
  }
};

StepGraphs::StepGraphs() : impl_(std::make_unique<Impl>()) {}
StepGraphs::~StepGraphs() = default;
size_t StepGraphs::captured() const { return impl_->captured; }

void StepGraphs::run(uint64_t key, const std::function<void()>& body) {
  Impl::Entry& e = impl_->entries[key];
  if (!g_graphs || e.eager || e.runs++ == 0) {
    body();  // graphs off, capture failed before, or the warm-up run of this key
    return;
  }
  if (e.exec == nullptr) {
    cudaStream_t s = cuda::stream();
    cuda::check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal),
                "cudaStreamBeginCapture");
    cudaGraph_t graph = nullptr;
    std::string why;
    try {
      body();
    } catch (const std::exception& ex) {
      why = ex.what();  // e.g. a launch kind this driver cannot capture
    }
    const cudaError_t ended = cudaStreamEndCapture(s, &graph);
    if (why.empty() && ended != cudaSuccess) why = cudaGetErrorString(ended);
    if (why.empty()) {
      const cudaError_t made = cudaGraphInstantiate(&e.exec, graph, 0);
      if (made != cudaSuccess) why = cudaGetErrorString(made);
    }
    if (graph) cudaGraphDestroy(graph);
    if (!why.empty()) {
      // Say so once and run this shape eagerly from now on.
      cudaGetLastError();
      e.exec = nullptr;
      e.eager = true;
      std::fprintf(stderr, "ninfer-server: step shape %llu runs without a CUDA graph: %s\n",
                   static_cast<unsigned long long>(key), why.c_str());
      body();
      return;
    }
    ++impl_->captured;
    g_captured.fetch_add(1);
  }
  cuda::check(cudaGraphLaunch(e.exec, cuda::stream()), "cudaGraphLaunch");
  g_replays.fetch_add(1);
}

bool host_weights() { return false; }

std::string describe() {
  return "GPU " + std::to_string(g_device.ordinal) + " (" + g_device.name + ", " +
         std::to_string(g_device.sm_count) + " SMs), CUDA graphs " + (g_graphs ? "on" : "off");
}

void to_device(void* dst, const void* src, size_t bytes) {
  cuda::check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cuda::stream()),
              "to_device");
}

void copy_on_device(void* dst, const void* src, size_t bytes) {
  cuda::check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cuda::stream()),
              "copy_on_device");
}

void to_host(void* dst, const void* src, size_t bytes) {
  cuda::check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cuda::stream()), "to_host");
}

void synchronize() { cuda::check(cudaStreamSynchronize(cuda::stream()), "synchronize"); }

}  // namespace backend
}  // namespace ninfer
