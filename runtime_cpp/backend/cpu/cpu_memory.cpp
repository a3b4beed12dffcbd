// backend/backend.h on the CPU: host memory; weights are read where the artifact holds them
// (its huge-page copy, or the mapping with --mmap-weights); init() refuses a CPU that lacks
// a vector feature the kernels were compiled for and sizes the kernel thread pool.
#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_features.h"
#include "model/artifact.h"

namespace ninfer::backend {

struct Arena::Impl {
  std::vector<void*> blocks;
  void* alloc(size_t bytes) {
    // A buffer of 2 MiB or more (a KV pool, a recurrent state, the logits) asks for
    // transparent huge pages before its first touch: decode streams through it every step,
    // as through the weights (Artifact::copy_to_huge_pages).
    constexpr size_t kHuge = size_t{2} << 20;
    const bool huge = bytes >= kHuge;
    void* p = nullptr;
    if (posix_memalign(&p, huge ? kHuge : 64, bytes ? bytes : 64) != 0) throw std::bad_alloc();
    if (huge) ::madvise(p, bytes, MADV_HUGEPAGE);  // best effort
    std::memset(p, 0, bytes);
    blocks.push_back(p);
    return p;
  }
};

Arena::Arena() : impl_(std::make_unique<Impl>()) {}
Arena::~Arena() {
  for (void* p : impl_->blocks) std::free(p);
}

float* Arena::floats(size_t count) { return static_cast<float*>(impl_->alloc(count * 4)); }
int32_t* Arena::ints(size_t count) { return static_cast<int32_t*>(impl_->alloc(count * 4)); }
void* Arena::bytes(size_t count) { return impl_->alloc(count); }

const float* Arena::weight(const Artifact& artifact, const std::string& name,
                           const std::vector<int64_t>& shape) {
  return artifact.tensor(name, shape);
}

const void* Arena::weight(const Artifact& artifact, const std::string& name,
                          const std::string& dtype, const std::vector<int64_t>& shape) {
  return artifact.tensor(name, dtype, shape);
}

void init(const Options& options) {
  const std::string refusal = cpu::features_refusal(cpu::kKernelFeatures);
  if (!refusal.empty()) throw std::runtime_error(refusal);
  if (options.threads > 0) cpu::set_num_threads(options.threads);
}

bool host_weights() { return true; }
std::string describe() { return std::to_string(cpu::num_threads()) + " threads"; }

void to_device(void* dst, const void* src, size_t bytes) {
  if (dst != src) std::memcpy(dst, src, bytes);
}
void to_host(void* dst, const void* src, size_t bytes) {
  if (dst != src) std::memcpy(dst, src, bytes);
}
void copy_on_device(void* dst, const void* src, size_t bytes) {
  if (dst != src) std::memcpy(dst, src, bytes);
}
void synchronize() {}

// The CPU has no graphs: every step runs its kernels directly.
struct StepGraphs::Impl {};
StepGraphs::StepGraphs() = default;
StepGraphs::~StepGraphs() = default;
void StepGraphs::run(uint64_t, const std::function<void()>& body) { body(); }
size_t StepGraphs::captured() const { return 0; }
bool graphs_enabled() { return false; }
GraphCounts graph_counts() { return {}; }

}  // namespace ninfer::backend
