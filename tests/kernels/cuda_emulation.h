// Host emulation of the CUDA subset the hand-written kernels use, so that their exact
// source (templates/cuda/*.cu.j2) can be compiled with g++ and run on the CPU
// (tests/kernels/test_cuda_emulation.py, tests/kernels/test_cuda_sampler.py).
//
// Every CUDA thread of a block is a coroutine on one OS thread (started with ucontext,
// switched with _setjmp/_longjmp, which do not save the signal mask: no system call per
// switch), switched round-robin at synchronization points; blocks run one after another, so a
// `__shared__` array can be a function-local static. __syncthreads() is a barrier over the block
// and
// __shfl_xor_sync and __ballot_sync a two-phase exchange through a barrier over the 32
// threads of a warp (all lanes must take part, as the full mask promises). A launch whose threads
// all wait with none able to proceed (a missing arrival) aborts.
#pragma once

#include <setjmp.h>
#include <ucontext.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

struct float2 {
  float x, y;
};
struct float4 {
  float x, y, z, w;
};
inline float2 make_float2(float x, float y) { return {x, y}; }
struct uint2 {
  uint32_t x, y;
};
inline uint2 make_uint2(uint32_t x, uint32_t y) { return {x, y}; }

// cuda_fp16.h and bit casts: g++'s _Float16 converts with round-to-nearest-even, as
// __float2half_rn does.
using __half = _Float16;
template <typename To, typename From>
inline To bits_as(From from) {
  static_assert(sizeof(To) == sizeof(From));
  To to;
  std::memcpy(&to, &from, sizeof to);
  return to;
}
inline __half __ushort_as_half(uint16_t b) { return bits_as<__half>(b); }
inline uint16_t __half_as_ushort(__half h) { return bits_as<uint16_t>(h); }
inline float __half2float(__half h) { return static_cast<float>(h); }
inline __half __float2half_rn(float x) { return static_cast<__half>(x); }
inline float __uint_as_float(uint32_t u) { return bits_as<float>(u); }
inline uint32_t __float_as_uint(float f) { return bits_as<uint32_t>(f); }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }

struct uint3 {
  unsigned x, y, z;
};
inline uint3 threadIdx, blockIdx, gridDim;

namespace emu {

struct Barrier {
  unsigned count = 0, arrived = 0;
  uint64_t generation = 0;
};

struct Fiber {
  ucontext_t context;  // the start
  jmp_buf resume;      // where it yielded
  bool started = false;
  std::vector<char> stack;
  bool done = false;
};

inline ucontext_t scheduler;
inline jmp_buf scheduler_resume;
inline std::vector<Fiber>* fibers = nullptr;
inline unsigned current = 0;
inline const std::function<void()>* kernel_body = nullptr;
inline Barrier block_barrier;
inline std::vector<Barrier> warp_barriers;
inline std::vector<float> warp_slots;     // 32 per warp
inline std::vector<unsigned> warp_votes;  // 32 per warp (__ballot_sync)
inline bool progressed = false;
// The launch's dynamic shared memory, then kGuard bytes that a kernel must leave alone.
inline std::vector<unsigned char> dynamic_shared;
constexpr size_t kGuard = 256;
constexpr unsigned char kGuardByte = 0xA5;

inline void yield() {
  if (!_setjmp((*fibers)[current].resume)) _longjmp(scheduler_resume, 1);
}

inline void wait(Barrier& b) {
  progressed = true;
  const uint64_t gen = b.generation;
  if (++b.arrived == b.count) {
    b.arrived = 0;
    ++b.generation;
    return;
  }
  while (b.generation == gen) yield();
}

inline void entry() {
  (*kernel_body)();
  (*fibers)[current].done = true;
  progressed = true;
  _longjmp(scheduler_resume, 1);  // never returns
}

// Runs body() for every thread of a (grid_x, grid_y) x threads launch (threads a multiple
// of 32) with smem_bytes of dynamic shared memory; blocks run one after another, x fastest.
// Each block's dynamic shared memory starts as NaNs (0xff bytes), so a read before a write
// shows; a write past smem_bytes aborts.
inline void launch(unsigned grid_x, unsigned grid_y, unsigned threads,
                   const std::function<void()>& body, size_t smem_bytes = 0) {
  constexpr size_t kStack = 64 * 1024;  // the kernels keep a few hundred bytes per thread
  static std::vector<Fiber> fs;         // stacks are reused by every launch
  if (fs.size() < threads) fs.resize(threads);
  for (auto& f : fs) f.stack.resize(kStack);
  fibers = &fs;
  kernel_body = &body;
  gridDim = {grid_x, grid_y, 1};
  for (unsigned b = 0; b < grid_x * grid_y; ++b) {
    dynamic_shared.assign(smem_bytes, 0xff);
    dynamic_shared.resize(smem_bytes + kGuard, kGuardByte);
    block_barrier = Barrier{threads};
    warp_barriers.assign(threads / 32, Barrier{32});
    warp_slots.assign(threads, 0.0f);
    warp_votes.assign(threads, 0u);
    for (unsigned t = 0; t < threads; ++t) {
      Fiber& f = fs[t];
      f.done = false;
      f.started = false;
      getcontext(&f.context);
      f.context.uc_stack.ss_sp = f.stack.data();
      f.context.uc_stack.ss_size = f.stack.size();
      f.context.uc_link = &scheduler;
      makecontext(&f.context, entry, 0);
    }
    for (bool running = true; running;) {
      running = false;
      progressed = false;
      for (unsigned t = 0; t < threads; ++t) {
        if (fs[t].done) continue;
        current = t;
        blockIdx = {b % grid_x, b / grid_x, 0};
        threadIdx = {t, 0, 0};
        if (!_setjmp(scheduler_resume)) {
          if (!fs[t].started) {
            fs[t].started = true;
            swapcontext(&scheduler, &fs[t].context);
          } else {
            _longjmp(fs[t].resume, 1);
          }
        }
        running = true;
      }
      if (running && !progressed) {
        std::fprintf(stderr, "emulated block %u deadlocked\n", b);
        std::abort();
      }
    }
    for (size_t i = smem_bytes; i < smem_bytes + kGuard; ++i) {
      if (dynamic_shared[i] != kGuardByte) {
        std::fprintf(stderr,
                     "emulated block %u wrote past its %zu bytes of dynamic shared memory\n", b,
                     smem_bytes);
        std::abort();
      }
    }
  }
}

}  // namespace emu

inline void __syncthreads() { emu::wait(emu::block_barrier); }

#define NINFER_DYNAMIC_SHARED(type, name) \
  type* name = reinterpret_cast<type*>(emu::dynamic_shared.data())

inline float __shfl_xor_sync(unsigned /*mask*/, float v, int offset) {
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* slots = emu::warp_slots.data() + warp * 32;
  slots[lane] = v;
  emu::wait(emu::warp_barriers[warp]);
  const float r = slots[lane ^ static_cast<unsigned>(offset)];
  emu::wait(emu::warp_barriers[warp]);
  return r;
}

inline int __shfl_xor_sync(unsigned mask, int v, int offset) {
  return bits_as<int>(__shfl_xor_sync(mask, bits_as<float>(v), offset));  // bits travel exactly
}

inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }

inline unsigned __ballot_sync(unsigned /*mask*/, int predicate) {
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  unsigned* votes = emu::warp_votes.data() + warp * 32;
  votes[lane] = predicate != 0;
  emu::wait(emu::warp_barriers[warp]);
  unsigned bits = 0;
  for (unsigned l = 0; l < 32; ++l) bits |= votes[l] << l;
  emu::wait(emu::warp_barriers[warp]);
  return bits;
}

inline int __popc(unsigned x) { return __builtin_popcount(x); }
