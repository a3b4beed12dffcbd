#include "engine/sampling.h"

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

// Exact top-k / top-p / temperature sampling without sorting the whole vocabulary (a
// 150k-entry sort per token costs ~10 ms): the candidates are the top_k tokens (partial
// sort), else, with top_p < 1, the shortest prefix of the descending order that holds
// top_p of the mass, found by growing a nth_element prefix 4x at a time; with neither,
// every token, unsorted (order does not change the distribution).
int32_t Sampler::sample(const float* logits, int vocab, const SamplingParams& p) {
  if (p.temperature <= 0.0f || p.top_k == 1) return argmax(logits, vocab);
  const double inv_t = 1.0 / p.temperature;
  const double top = logits[argmax(logits, vocab)];
  auto weight = [&](int32_t id) { return std::exp((logits[id] - top) * inv_t); };
  auto by_logit = [&](int32_t a, int32_t b) { return logits[a] > logits[b]; };
  std::vector<int32_t> ids(vocab);
  std::iota(ids.begin(), ids.end(), 0);
  int keep = vocab;
  bool sorted = false;
  double total = -1;  // mass of the candidates top_p is relative to (-1: of those kept)
  if (p.top_k > 0 && p.top_k < vocab) {
    keep = p.top_k;
    std::partial_sort(ids.begin(), ids.begin() + keep, ids.end(), by_logit);
    sorted = true;
  } else if (p.top_p < 1.0f) {
    total = 0;
    for (int i = 0; i < vocab; ++i) total += weight(i);
    const double want = p.top_p * total;
    for (int c = std::min(vocab, 64);; c = std::min(vocab, c * 4)) {
      if (c < vocab) std::nth_element(ids.begin(), ids.begin() + c, ids.end(), by_logit);
      double mass = 0;
      for (int i = 0; i < c; ++i) mass += weight(ids[i]);
      if (mass >= want || c == vocab) {
        keep = c;
        break;
      }
    }
    std::sort(ids.begin(), ids.begin() + keep, by_logit);
    sorted = true;
  }
  std::vector<double> probs(keep);
  double sum = 0;
  for (int i = 0; i < keep; ++i) sum += probs[i] = weight(ids[i]);
  if (p.top_p < 1.0f && sorted) {
    const double norm = total > 0 ? total : sum;
    double cum = 0;
    int cut = keep;
    for (int i = 0; i < keep; ++i) {
      cum += probs[i] / norm;
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
