// Token sampling, in vLLM's order: the logits processors that change the model's scores
// (min_tokens, logit_bias, then the penalties: repetition, frequency, presence), then the
// request's constraints (constraint.h, applied by the engine), then temperature, min_p,
// top_k and top_p, and a seeded draw. Logprobs, when asked for, are those of the model's
// own distribution (log-softmax of the raw logits, before any of the above: vLLM's default
// `raw_logprobs` mode).
//
// Everything here is exact and avoids full-vocabulary sorts: the penalties touch only the
// tokens a sequence has seen, the candidates of top_k / top_p come from partial selection.
// A logit of -infinity is a masked token; a row where every token is masked throws
// std::runtime_error (the engine fails the request with that message).
#pragma once

#include <cstdint>
#include <random>
#include <unordered_map>
#include <utility>
#include <vector>

namespace ninfer {

struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy
  float top_p = 1.0f;
  int top_k = 0;                    // 0 or -1 = disabled
  float min_p = 0.0f;               // [0, 1]: drop tokens below min_p * the top token's probability
  float presence_penalty = 0.0f;    // [-2, 2], over generated tokens (OpenAI / vLLM)
  float frequency_penalty = 0.0f;   // [-2, 2], over generated tokens, per occurrence
  float repetition_penalty = 1.0f;  // > 0, over prompt and generated tokens (HF / vLLM)
  std::vector<std::pair<int32_t, float>> logit_bias;  // added to the logits

  bool has_penalties() const {
    return presence_penalty != 0.0f || frequency_penalty != 0.0f || repetition_penalty != 1.0f;
  }
};

// How often each token occurred in one sequence: in the prompt (repetition penalty) and
// in the output (all three penalties). Holds only the tokens seen.
class TokenCounts {
 public:
  void add_prompt(const std::vector<int32_t>& prompt);
  void add_output(int32_t token);
  // vLLM's apply_penalties: a seen token's logit l becomes l / r if l > 0 else l * r
  // (r = repetition_penalty, prompt or output), then l -= frequency * count + presence
  // (output only).
  void apply(float* logits, int vocab, const SamplingParams& p) const;
  // Calls f(token, seen in the prompt, output count) for every token seen.
  template <typename F>
  void each(F&& f) const {
    for (const auto& [id, c] : counts_) f(id, c.prompt, c.output);
  }

 private:
  struct Count {
    int output = 0;
    bool prompt = false;
  };
  std::unordered_map<int32_t, Count> counts_;
};

// What a row where every token is masked fails its request with (host and device).
extern const char kAllMaskedError[];

// Adds each bias to its token's logit (ids were validated by the caller).
void apply_logit_bias(float* logits, int vocab, const SamplingParams& p);

// The distribution Sampler::sample draws from once temperature, min_p, top_k and top_p
// are applied: token ids[i] has weight weights[i] (unnormalised: 0 below min_p or masked),
// in the order the draw walks them; every other token has probability 0.
struct Candidates {
  std::vector<int32_t> ids;
  std::vector<double> weights;
  double sum = 0;
  // The probability of `id` (0 when it is not a candidate).
  double probability(int32_t id) const;
};

// Whether p samples greedily (temperature <= 0 or top_k == 1): the argmax, no draw.
inline bool is_greedy(const SamplingParams& p) { return p.temperature <= 0.0f || p.top_k == 1; }

// Candidates of a sampled (not greedy) row whose argmax is `best` (>= 0).
Candidates candidates(const float* logits, int vocab, const SamplingParams& p, int32_t best);

// Speculative decoding's verdict on one draft token at one position: `token` is the
// position's output (the draft when accepted).
struct DraftVerdict {
  int32_t token = 0;
  bool accepted = false;
};

class Sampler {
 public:
  explicit Sampler(uint64_t seed) : rng_(seed) {}
  // Temperature, min_p, top_k, top_p and the draw over the (processed) logits; greedy
  // when temperature <= 0 or top_k == 1. Masked (-inf) tokens are never drawn; throws
  // std::runtime_error when every token is masked.
  int32_t sample(const float* logits, int vocab, const SamplingParams& p);
  // Lossless verification of `draft` against the (processed) logits of its position, so
  // that the position's output follows exactly the distribution sample() draws from.
  // A draft proposed with certainty (q = nullptr: n-gram lookup) is decided by the
  // position's own draw: the output is sample()'s token, the draft accepted iff they are
  // equal. That is rejection sampling against a point mass (accepted with probability
  // p(draft), else a draw from p without it), and it uses the generator exactly as
  // sample() does, so a seeded request gives the same tokens with or without drafts, and
  // whatever its drafts were. A draft drawn from a distribution `q` over the vocabulary (a
  // draft model) is accepted with probability min(1, p(draft) / q(draft)), else the
  // output is drawn from the normalised residual max(0, p - q) (Leviathan et al.; vLLM's
  // rejection sampler); greedy rows accept the draft iff it is the argmax.
  DraftVerdict verify(const float* logits, int vocab, const SamplingParams& p, int32_t draft,
                      const float* q = nullptr);

 private:
  // One of ids by weight (-1 when every weight is 0).
  int32_t draw(const std::vector<int32_t>& ids, const std::vector<double>& weights, double sum);
  std::mt19937_64 rng_;
};

// The first index of the largest logit; -1 when every logit is -inf (or NaN).
int32_t argmax(const float* logits, int vocab);

// Log-probabilities of the model's distribution at one position.
struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  // the most likely tokens, most likely first
};

// log-softmax of `logits`, evaluated at `token`, and the `top` most likely tokens (partial
// selection; ties by lower id first).
class LogSoftmax {
 public:
  LogSoftmax(const float* logits, int vocab);
  float logprob(int32_t token) const;
  std::vector<std::pair<int32_t, float>> top(int n) const;

 private:
  const float* logits_;
  int vocab_;
  double log_norm_;  // max + log(sum(exp(l - max)))
};

}  // namespace ninfer
