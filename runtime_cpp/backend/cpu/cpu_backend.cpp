#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include <tvm/runtime/c_backend_api.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define NINFER_CPU_RELAX() _mm_pause()
#else
#define NINFER_CPU_RELAX() ((void)0)
#endif

namespace ninfer::cpu {
namespace {

thread_local std::string g_last_error;

// NINFER_PROFILE=1: wall time of every kernel call, summed per kernel and printed to
// stderr at exit (the CPU analogue of nsys's kernel summary). Off: one branch per call.
// NINFER_PROFILE_SKIP=N leaves the first N calls of the process out (a warm-up whose
// call count a first run printed), so the sums are of the steady state alone.
class KernelProfile {
 public:
  static KernelProfile* get() {
    static KernelProfile* p = std::getenv("NINFER_PROFILE") ? new KernelProfile : nullptr;
    return p;
  }
  void add(const char* name, double seconds) {
    std::lock_guard<std::mutex> lock(mu_);
    if (skip_ > 0) {
      --skip_;
      return;
    }
    auto& e = totals_[name];
    e.first += 1;
    e.second += seconds;
  }
  static void report() {
    KernelProfile* p = get();
    if (!p) return;
    std::vector<std::pair<std::string, std::pair<long, double>>> rows(p->totals_.begin(),
                                                                      p->totals_.end());
    std::sort(rows.begin(), rows.end(),
              [](const auto& a, const auto& b) { return a.second.second > b.second.second; });
    double total = 0;
    for (const auto& r : rows) total += r.second.second;
    std::fprintf(stderr, "ninfer kernel profile: %.3f s in kernel calls\n", total);
    std::fprintf(stderr, "%10s %10s %7s  %s\n", "calls", "us/call", "share", "kernel");
    for (const auto& r : rows)
      std::fprintf(stderr, "%10ld %10.2f %6.1f%%  %s\n", r.second.first,
                   1e6 * r.second.second / double(r.second.first),
                   100.0 * r.second.second / (total > 0 ? total : 1), r.first.c_str());
  }

 private:
  KernelProfile() {
    if (const char* s = std::getenv("NINFER_PROFILE_SKIP")) skip_ = std::strtol(s, nullptr, 10);
    std::atexit(&KernelProfile::report);
  }
  std::mutex mu_;
  long skip_ = 0;
  std::map<std::string, std::pair<long, double>> totals_;
};

// A fork-join pool: the caller runs task 0, workers run the rest. Idle workers spin on a
// generation counter (kernel launches come back to back during a forward pass), then
// yield, then sleep on a condition variable, by wall time.
class ThreadPool {
 public:
  using Clock = std::chrono::steady_clock;
  // An idle worker pauses this long, then yields its core until kSleepAfter, then sleeps:
  // a condition-variable wake-up costs tens of microseconds, while the gaps between the
  // launches of a forward pass are a few. By time, not by count: a yield returns at once
  // on an idle core but waits out other threads' time slices on a busy one, where 20000
  // yields (this pool's earlier limit) kept an idle pool's worker in the run queue for
  // seconds, halving another engine's decode in the same process.
  static constexpr auto kPauseFor = std::chrono::microseconds(50);
  static constexpr auto kSleepAfter = std::chrono::microseconds(2000);

  explicit ThreadPool(int n) { resize(n); }
  ~ThreadPool() { stop(); }

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  void resize(int n) {
    stop();
    stopping_ = false;
    const uint64_t current = generation_.load();
    for (int i = 1; i < n; ++i) workers_.emplace_back([this, i, current] { worker(i, current); });
  }

  int run(FTVMParallelLambda fn, void* cdata, int num_task) {
    if (num_task <= 0 || num_task > size()) num_task = size();
    TVMParallelGroupEnv env{nullptr, num_task};
    if (num_task == 1) return fn(0, &env, cdata);
    {
      std::lock_guard<std::mutex> lock(mu_);
      fn_ = fn;
      cdata_ = cdata;
      env_ = env;
      pending_.store(num_task - 1);
      status_.store(0);
      generation_.fetch_add(1, std::memory_order_release);
    }
    cv_.notify_all();
    int rc = fn(0, &env_, cdata);
    // Yield after a while so an oversubscribed machine still runs the workers.
    Clock::time_point since{};
    for (int spin = 0; pending_.load(std::memory_order_acquire) != 0; ++spin) {
      if (spin % 64 == 0 && spin > 0 && past(since, kPauseFor)) std::this_thread::yield();
      else NINFER_CPU_RELAX();
    }
    return rc != 0 ? rc : status_.load();
  }

 private:
  // `seen` starts at the generation current at creation: work launched before this
  // worker existed is not its to run.
  void worker(int id, uint64_t seen) {
    for (;;) {
      uint64_t gen = generation_.load(std::memory_order_acquire);
      Clock::time_point since{};
      bool yielding = false;
      for (int spin = 1; gen == seen; ++spin) {
        if (yielding || spin % 64 == 0) {  // the clock every 64 pauses (~0.6 us here)
          if (past(since, kSleepAfter)) break;
          yielding = past(since, kPauseFor);
        }
        if (yielding) std::this_thread::yield();
        else NINFER_CPU_RELAX();
        gen = generation_.load(std::memory_order_acquire);
      }
      if (gen == seen) {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || generation_.load() != seen; });
        if (stopping_) return;
        gen = generation_.load();
      }
      seen = gen;
      if (id < env_.num_task) {
        if (fn_(id, &env_, cdata_) != 0) status_.store(-1);
        pending_.fetch_sub(1, std::memory_order_acq_rel);
      }
    }
  }

  // Whether `wait` has passed since `since`, which the first call sets to now.
  static bool past(Clock::time_point& since, Clock::duration wait) {
    const Clock::time_point now = Clock::now();
    if (since == Clock::time_point{}) since = now;
    return now - since >= wait;
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
  }

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<int> status_{0};
  FTVMParallelLambda fn_ = nullptr;
  void* cdata_ = nullptr;
  TVMParallelGroupEnv env_{nullptr, 1};
};

ThreadPool& pool() {
  static ThreadPool p(static_cast<int>(std::thread::hardware_concurrency()));
  return p;
}

int parallel_launch(FTVMParallelLambda fn, void* cdata, int num_task) {
  return pool().run(fn, cdata, num_task);
}

int parallel_barrier(int, TVMParallelGroupEnv*) {
  // Our kernels do not synchronize inside a parallel region; TVM only emits barriers
  // for schedules we do not use. Failing loudly beats a silent race.
  g_last_error = "TVMBackendParallelBarrier is not supported by the ninfer CPU backend";
  return -1;
}

void* alloc_workspace(int, int, uint64_t nbytes, int, int) {
  void* p = nullptr;
  if (posix_memalign(&p, 64, nbytes ? nbytes : 64) != 0) return nullptr;
  return p;
}

int free_workspace(int, int, void* ptr) {
  std::free(ptr);
  return 0;
}

}  // namespace

void set_num_threads(int n) { pool().resize(n < 1 ? 1 : n); }
int num_threads() { return pool().size(); }

void KernelArgs::reserve_arg(const char* what) {
  if (num_args_ >= kMaxArgs)
    throw std::length_error(std::string("kernel call with more than ") + std::to_string(kMaxArgs) +
                            " arguments (at a " + what + ")");
}

KernelArgs& KernelArgs::tensor(const void* data, DLDataType dtype,
                               std::initializer_list<int64_t> shape) {
  reserve_arg("tensor");
  if (shape.size() > kMaxDims)
    throw std::length_error("kernel tensor argument with " + std::to_string(shape.size()) +
                            " dimensions; at most " + std::to_string(kMaxDims));
  const int i = num_args_++;
  DLTensor& t = tensors_[i];
  t.data = const_cast<void*>(data);
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = static_cast<int32_t>(shape.size());
  t.dtype = dtype;
  int d = 0;
  for (int64_t s : shape) shapes_[i][d++] = s;
  t.shape = shapes_[i];
  t.strides = nullptr;
  t.byte_offset = 0;
  args_[i].type_index = kTVMFFIDLTensorPtr;
  args_[i].v_ptr = &t;
  return *this;
}

KernelArgs& KernelArgs::scalar(int64_t value) {
  reserve_arg("scalar");
  const int i = num_args_++;
  args_[i].type_index = kTVMFFIInt;
  args_[i].v_int64 = value;
  return *this;
}

void KernelArgs::call(PackedKernel fn, const char* name) {
  TVMFFIAny result{};
  result.type_index = kTVMFFINone;
  using Clock = std::chrono::steady_clock;
  KernelProfile* profile = KernelProfile::get();
  const Clock::time_point t0 = profile ? Clock::now() : Clock::time_point{};
  if (fn(nullptr, args_, num_args_, &result) != 0) {
    throw std::runtime_error(std::string("kernel ") + name + " failed: " + g_last_error);
  }
  if (profile) profile->add(name, std::chrono::duration<double>(Clock::now() - t0).count());
}

}  // namespace ninfer::cpu

// Backend hooks the LLVM-built kernel objects reference as weak pointer variables.
extern "C" {
int (*__TVMBackendParallelLaunch)(FTVMParallelLambda, void*, int) = ninfer::cpu::parallel_launch;
int (*__TVMBackendParallelBarrier)(int, TVMParallelGroupEnv*) = ninfer::cpu::parallel_barrier;
void* (*__TVMBackendAllocWorkspace)(int, int, uint64_t, int, int) = ninfer::cpu::alloc_workspace;
int (*__TVMBackendFreeWorkspace)(int, int, void*) = ninfer::cpu::free_workspace;

void TVMFFIErrorSetRaisedFromCStrParts(const char* kind, const char** parts, int32_t n) {
  std::string msg = kind ? std::string(kind) + ": " : std::string();
  for (int32_t i = 0; i < n; ++i)
    if (parts[i]) msg += parts[i];
  ninfer::cpu::g_last_error = msg;
}
}
