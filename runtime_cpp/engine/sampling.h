// Token sampling: greedy, temperature, top-k, top-p, seeded.
#pragma once

#include <cstdint>
#include <random>

namespace ninfer {

struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy
  float top_p = 1.0f;
  int top_k = 0;  // 0 = disabled
};

class Sampler {
 public:
  explicit Sampler(uint64_t seed) : rng_(seed) {}
  int32_t sample(const float* logits, int vocab, const SamplingParams& p);

 private:
  std::mt19937_64 rng_;
};

int32_t argmax(const float* logits, int vocab);

}  // namespace ninfer
