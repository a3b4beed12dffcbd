#include "sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace ninfer {

int32_t argmax(const float* logits, int vocab) {
  int32_t best = 0;
  for (int i = 1; i < vocab; ++i)
    if (logits[i] > logits[best]) best = i;
  return best;
}

int32_t Sampler::sample(const float* logits, int vocab, const SamplingParams& p) {
  if (p.temperature <= 0.0f || p.top_k == 1) return argmax(logits, vocab);
  std::vector<int32_t> ids(vocab);
  std::iota(ids.begin(), ids.end(), 0);
  int keep = vocab;
  if (p.top_k > 0 && p.top_k < vocab) {
    keep = p.top_k;
    std::partial_sort(ids.begin(), ids.begin() + keep, ids.end(),
                      [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  } else {
    std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  }
  std::vector<double> probs(keep);
  const double inv_t = 1.0 / p.temperature, top = logits[ids[0]];
  double sum = 0;
  for (int i = 0; i < keep; ++i) sum += probs[i] = std::exp((logits[ids[i]] - top) * inv_t);
  if (p.top_p < 1.0f) {
    double cum = 0;
    int cut = keep;
    for (int i = 0; i < keep; ++i) {
      cum += probs[i] / sum;
      if (cum >= p.top_p) {
        cut = i + 1;
        break;
      }
    }
    keep = cut;
    sum = std::accumulate(probs.begin(), probs.begin() + keep, 0.0);
  }
  double r = std::uniform_real_distribution<double>(0.0, sum)(rng_);
  for (int i = 0; i < keep; ++i) {
    r -= probs[i];
    if (r <= 0) return ids[i];
  }
  return ids[keep - 1];
}

}  // namespace ninfer
