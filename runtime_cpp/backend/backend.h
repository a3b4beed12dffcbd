// Memory of the backend a model is built for: host memory on the CPU, device memory on
// CUDA. The step program (templates/model.cpp.j2) allocates and moves data only
// through these, so it is the same for every backend; each backend links one
// implementation (cpu/cpu_memory.cpp or cuda/cuda_memory.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace ninfer {

class Artifact;

namespace backend {

// Owns every allocation of one model instance; freed together.
class Arena {
 public:
  Arena();
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  float* floats(size_t count);  // zeroed, 64-byte aligned
  int32_t* ints(size_t count);  // zeroed, 64-byte aligned
  void* bytes(size_t count);    // zeroed, 64-byte aligned (e.g. a KV pool in its format)
  // A weight from the artifact where kernels can read it (checked by name and shape).
  const float* weight(const Artifact& artifact, const std::string& name,
                      const std::vector<int64_t>& shape);
  // A weight of another dtype (f16, bf16, i8, u8: quantized parts), likewise.
  const void* weight(const Artifact& artifact, const std::string& name, const std::string& dtype,
                     const std::vector<int64_t>& shape);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct Options {
  int threads = 0;              // CPU: kernel threads (0 = all cores)
  bool allow_more_sms = false;  // CUDA: accept a GPU with more SMs than the target
  bool graphs = true;           // CUDA: replay steps as CUDA graphs (--no-cuda-graph: eager)
};

// Recorded steps, one per key (the step program's shape: padded rows x logits rows).
// CUDA with graphs on: the first run of a key is eager (lazy allocations and kernel
// attributes happen there), the second is captured into a CUDA graph and launched, and
// later runs only launch it. The body must take every per-step value from device memory
// (tokens, positions, block tables...) that is written before run(), so a replay never
// sees a stale value. Otherwise (CPU, or graphs off) run() calls the body.
class StepGraphs {
 public:
  StepGraphs();
  ~StepGraphs();
  StepGraphs(const StepGraphs&) = delete;
  StepGraphs& operator=(const StepGraphs&) = delete;
  void run(uint64_t key, const std::function<void()>& body);
  size_t captured() const;  // graphs instantiated so far

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};
// Whether steps are replayed as graphs (then the step program pads rows to buckets).
bool graphs_enabled();

// This process's CUDA graphs so far, over every StepGraphs: instantiated, and launched
// (replays). `available` is false where the backend has none (the CPU).
struct GraphCounts {
  bool available = false;
  uint64_t captured = 0, replays = 0;
};
GraphCounts graph_counts();

// Prepares the backend before a model is created. CUDA: selects the GPU and refuses
// one whose compute capability or SM count differs from the compiled target.
void init(const Options& options);
// Whether kernels read the weights where the artifact holds them, in host memory (the
// CPU), rather than from copies in device memory (CUDA).
bool host_weights();
// One line for the start-up banner, e.g. "2 threads" or "GPU 0 (NVIDIA H200, 132 SMs)".
std::string describe();

void to_device(void* dst, const void* src, size_t bytes);
void to_host(void* dst, const void* src, size_t bytes);
// Device memory to device memory, ordered with the kernels (a recurrent state checkpoint).
void copy_on_device(void* dst, const void* src, size_t bytes);
void synchronize();

}  // namespace backend
}  // namespace ninfer
