#include "engine/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <vector>

namespace ninfer {

const char kAllMaskedError[] =
    "every token of the vocabulary is masked (logit -inf) at this position: the request's "
    "constraints, logit_bias or min_tokens leave nothing to sample";

int32_t argmax(const float* logits, int vocab) {
  int32_t best = -1;
  float value = -std::numeric_limits<float>::infinity();
  for (int i = 0; i < vocab; ++i)
    if (logits[i] > value) {
      value = logits[i];
      best = i;
    }
  return best;
}

void TokenCounts::add_prompt(const std::vector<int32_t>& prompt) {
  for (int32_t t : prompt) counts_[t].prompt = true;
}

void TokenCounts::add_output(int32_t token) { ++counts_[token].output; }

void TokenCounts::apply(float* logits, int vocab, const SamplingParams& p) const {
  const float rep = p.repetition_penalty;
  for (const auto& [id, c] : counts_) {
    if (id < 0 || id >= vocab) continue;
    float& l = logits[id];
    if (rep != 1.0f) l = l > 0 ? l / rep : l * rep;
    if (c.output > 0) {
      l -= p.frequency_penalty * static_cast<float>(c.output);
      l -= p.presence_penalty;
    }
  }
}

void apply_logit_bias(float* logits, int vocab, const SamplingParams& p) {
  for (const auto& [id, bias] : p.logit_bias)
    if (id >= 0 && id < vocab) logits[id] += bias;
}

// Exact temperature / min_p / top-k / top-p sampling without sorting the whole vocabulary
// (a 150k-entry sort per token costs ~10 ms): the candidates are the top_k tokens (partial
// sort), else, with top_p < 1, the shortest prefix of the descending order that holds
// top_p of the mass, found by growing a nth_element prefix 4x at a time; with neither,
// every token, unsorted (order does not change the distribution). min_p zeroes the weight
// of every token whose probability is below min_p times the top token's, before top_p
// measures the mass (vLLM v1 applies min_p before top-k / top-p; min_p and top_k commute).
Candidates candidates(const float* logits, int vocab, const SamplingParams& p, int32_t best) {
  const double inv_t = 1.0 / p.temperature;
  const double top = logits[best];
  const double min_weight = p.min_p > 0 ? p.min_p : 0.0;  // the top token's weight is 1
  auto weight = [&](int32_t id) {
    const double w = std::exp((logits[id] - top) * inv_t);
    return w >= min_weight ? w : 0.0;
  };
  auto by_logit = [&](int32_t a, int32_t b) { return logits[a] > logits[b]; };
  Candidates c;
  std::vector<int32_t>& ids = c.ids;
  ids.resize(vocab);
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
    for (int n = std::min(vocab, 64);; n = std::min(vocab, n * 4)) {
      if (n < vocab) std::nth_element(ids.begin(), ids.begin() + n, ids.end(), by_logit);
      double mass = 0;
      for (int i = 0; i < n; ++i) mass += weight(ids[i]);
      if (mass >= want || n == vocab) {
        keep = n;
        break;
      }
    }
    std::sort(ids.begin(), ids.begin() + keep, by_logit);
    sorted = true;
  }
  std::vector<double>& probs = c.weights;
  probs.resize(keep);
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
  ids.resize(keep);
  probs.resize(keep);
  c.sum = sum;
  return c;
}

double Candidates::probability(int32_t id) const {
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] == id) return weights[i] / sum;
  return 0.0;
}

// r in [0, sum): a token of weight 0 (masked, or below min_p) is never drawn.
int32_t Sampler::draw(const std::vector<int32_t>& ids, const std::vector<double>& weights,
                      double sum) {
  double r = std::uniform_real_distribution<double>(0.0, sum)(rng_);
  const int keep = static_cast<int>(ids.size());
  for (int i = 0; i < keep; ++i) {
    if (r < weights[i]) return ids[i];
    r -= weights[i];
  }
  for (int i = keep - 1; i >= 0; --i)  // rounding left r at the very end
    if (weights[i] > 0) return ids[i];
  return -1;  // no weight at all
}

int32_t Sampler::sample(const float* logits, int vocab, const SamplingParams& p) {
  const int32_t best = argmax(logits, vocab);
  if (best < 0) throw std::runtime_error(kAllMaskedError);
  if (is_greedy(p)) return best;
  const Candidates c = candidates(logits, vocab, p, best);
  const int32_t token = draw(c.ids, c.weights, c.sum);
  return token >= 0 ? token : best;  // best has weight 1: not reached
}

DraftVerdict Sampler::verify(const float* logits, int vocab, const SamplingParams& p, int32_t draft,
                             const float* q) {
  if (q == nullptr) {  // a certain draft: the position's own draw decides (see sampling.h)
    const int32_t token = sample(logits, vocab, p);
    return {token, token == draft};
  }
  const int32_t best = argmax(logits, vocab);
  if (best < 0) throw std::runtime_error(kAllMaskedError);
  if (is_greedy(p)) return {best, draft == best};
  const Candidates c = candidates(logits, vocab, p, best);
  const double pd = draft >= 0 && draft < vocab ? c.probability(draft) : 0.0;
  const double qd = draft >= 0 && draft < vocab ? q[draft] : 0.0;
  const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
  if (pd > 0 && qd > 0 && u * qd < pd) return {draft, true};
  // The residual max(0, p - q) over the candidates (q's other tokens have p = 0).
  std::vector<double> residual(c.ids.size());
  double sum = 0;
  for (size_t i = 0; i < c.ids.size(); ++i) {
    const int32_t id = c.ids[i];
    const double qi = q[id];
    sum += residual[i] = std::max(0.0, c.weights[i] / c.sum - qi);
  }
  if (!(sum > 0)) {  // p == q up to rounding: a draw from p
    const int32_t token = draw(c.ids, c.weights, c.sum);
    return {token >= 0 ? token : best, false};
  }
  return {draw(c.ids, residual, sum), false};
}

LogSoftmax::LogSoftmax(const float* logits, int vocab) : logits_(logits), vocab_(vocab) {
  const int32_t best = argmax(logits, vocab);
  if (best < 0) {
    log_norm_ = std::numeric_limits<double>::infinity();
    return;
  }
  const double top = logits[best];
  double sum = 0;
  for (int i = 0; i < vocab; ++i) sum += std::exp(logits[i] - top);
  log_norm_ = top + std::log(sum);
}

float LogSoftmax::logprob(int32_t token) const {
  return static_cast<float>(logits_[token] - log_norm_);
}

std::vector<std::pair<int32_t, float>> LogSoftmax::top(int n) const {
  n = std::min(n, vocab_);
  // A min-heap (by "better") of the best n so far: one pass, no vocabulary-sized buffer.
  auto better = [&](int32_t a, int32_t b) {
    return logits_[a] > logits_[b] || (logits_[a] == logits_[b] && a < b);
  };
  std::vector<int32_t> heap;
  heap.reserve(n);
  for (int32_t i = 0; i < vocab_ && n > 0; ++i) {
    if (static_cast<int>(heap.size()) < n) {
      heap.push_back(i);
      std::push_heap(heap.begin(), heap.end(), better);
    } else if (better(i, heap.front())) {
      std::pop_heap(heap.begin(), heap.end(), better);
      heap.back() = i;
      std::push_heap(heap.begin(), heap.end(), better);
    }
  }
  std::sort(heap.begin(), heap.end(), better);
  std::vector<std::pair<int32_t, float>> out;
  out.reserve(heap.size());
  for (int32_t id : heap) out.emplace_back(id, logprob(id));
  return out;
}

}  // namespace ninfer
