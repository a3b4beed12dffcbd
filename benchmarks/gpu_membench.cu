// Measures the two memory numbers the GPU target profiles carry, on the GPU that runs it:
//   - dependent-load latency (ns) of global memory beyond L2: one thread chases a random
//     cyclic permutation over a buffer much larger than L2 (profile: memory_latency_ns);
//   - streaming read bandwidth (GB/s) of a grid-wide vectorised sum.
// Built here by scripts/gpu_check.sh prepare (nvcc -arch of the target), run there.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <vector>

#define CHECK(x)                                                                  \
  do {                                                                            \
    cudaError_t e_ = (x);                                                         \
    if (e_ != cudaSuccess) {                                                      \
      std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));               \
      std::exit(1);                                                               \
    }                                                                             \
  } while (0)

__global__ void chase(const uint32_t* next, uint32_t start, int steps, uint32_t* sink) {
  uint32_t i = start;
  for (int s = 0; s < steps; ++s) i = next[i];
  *sink = i;
}

__global__ void stream_sum(const float4* x, size_t n, float* sink) {
  float acc = 0.f;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    float4 v = x[i];
    acc += v.x + v.y + v.z + v.w;
  }
  if (acc == 1234.5f) *sink = acc;  // keeps the loads; practically never taken
}

int main() {
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, cc %d.%d, %d SMs, L2 %d MiB\n", prop.name, prop.major, prop.minor,
              prop.multiProcessorCount, prop.l2CacheSize >> 20);

  // Latency: 512 MiB of 4-byte indices, one random cycle visiting 64-byte-spaced slots.
  const size_t slots = (512ull << 20) / 64, stride = 16;
  std::vector<uint32_t> order(slots);
  std::iota(order.begin(), order.end(), 0u);
  std::shuffle(order.begin() + 1, order.end(), std::mt19937(42));
  std::vector<uint32_t> next(slots * stride, 0);
  for (size_t k = 0; k < slots; ++k)
    next[order[k] * stride] = order[(k + 1) % slots] * stride;
  uint32_t *d_next, *d_sink;
  CHECK(cudaMalloc(&d_next, next.size() * 4));
  CHECK(cudaMalloc(&d_sink, 64));
  CHECK(cudaMemcpy(d_next, next.data(), next.size() * 4, cudaMemcpyHostToDevice));
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  chase<<<1, 1>>>(d_next, 0, 10000, d_sink);  // warm the TLB walk caches a little
  const int steps = 200000;
  CHECK(cudaEventRecord(a));
  chase<<<1, 1>>>(d_next, 0, steps, d_sink);
  CHECK(cudaEventRecord(b));
  CHECK(cudaEventSynchronize(b));
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, a, b));
  std::printf("memory_latency_ns: %.0f (dependent loads over 512 MiB, %d steps)\n",
              ms * 1e6 / steps, steps);

  // Bandwidth: 2 GiB read, best of 5.
  const size_t n4 = (2ull << 30) / 16;
  float4* d_x;
  CHECK(cudaMalloc(&d_x, n4 * 16));
  CHECK(cudaMemset(d_x, 0, n4 * 16));
  float best = 1e30f;
  for (int r = 0; r < 6; ++r) {
    CHECK(cudaEventRecord(a));
    stream_sum<<<prop.multiProcessorCount * 8, 512>>>(d_x, n4, (float*)d_sink);
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    CHECK(cudaEventElapsedTime(&ms, a, b));
    if (r > 0 && ms < best) best = ms;
  }
  std::printf("read_bandwidth_gbs: %.0f (2 GiB, best of 5)\n", n4 * 16 / (best * 1e6));
  CHECK(cudaGetLastError());
  return 0;
}
