// Sampler: empirical frequencies against the exact top-k / top-p / min_p / temperature
// distribution (sampling_stats.h), on a 1000-token vocabulary whose mass
// spreads over hundreds of tokens, so that the top-p prefix search grows several times,
// also with a third of the vocabulary masked (-inf). The settings are checked on two
// threads (each with its own seeded sampler). Then the logits processors (penalties,
// logit_bias) on hand-computed values, masked rows, and the log-softmax of logprobs.
// The comparison is Pearson's chi-square over the kept tokens (sampling_stats.h).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "engine/sampling.h"
#include "harness.h"
#include "sampling_stats.h"

namespace ninfer::fake {
namespace {

void check_sampler(const std::vector<float>& logits, const SamplingParams& p, int draws) {
  const int vocab = static_cast<int>(logits.size());
  const std::vector<double> want = exact_distribution(logits, p);
  std::vector<int> seen(vocab, 0);
  Sampler sampler(1234);
  for (int d = 0; d < draws; ++d) ++seen[sampler.sample(logits.data(), vocab, p)];
  check_draws(seen, want, draws,
              "sampler (top_p " + std::to_string(p.top_p) + ", top_k " + std::to_string(p.top_k) +
                  ", min_p " + std::to_string(p.min_p) + ", temperature " +
                  std::to_string(p.temperature) + ")");
}

}  // namespace

void test_sampling() {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  std::vector<float> logits(1000);
  for (float& x : logits) x = normal(rng);
  std::vector<float> masked = logits;  // a third masked, as a constraint or min_tokens does
  for (size_t i = 0; i < masked.size(); i += 3) masked[i] = -INFINITY;
  struct Setting {
    const std::vector<float>* logits;
    SamplingParams p;
  };
  std::vector<Setting> settings;
  for (float top_p : {1.0f, 0.95f, 0.5f, 0.05f})
    for (int top_k : {0, 40})
      for (float temperature : {1.0f, 0.7f}) {
        SamplingParams p;
        p.top_p = top_p;
        p.top_k = top_k;
        p.temperature = temperature;
        settings.push_back({&logits, p});
      }
  for (float min_p : {0.05f, 0.3f})
    for (float top_p : {1.0f, 0.8f})
      for (int top_k : {0, 40}) {
        SamplingParams p;
        p.min_p = min_p;
        p.top_p = top_p;
        p.top_k = top_k;
        p.temperature = 0.8f;
        settings.push_back({&logits, p});
      }
  for (int top_k : {0, 40}) {
    SamplingParams p;
    p.top_k = top_k;
    p.top_p = 0.9f;
    settings.push_back({&masked, p});
    p.top_p = 1.0f;
    settings.push_back({&masked, p});
  }
  // fail() exits the process, so a failure on either thread ends the test with its message.
  auto half = [&](size_t first) {
    for (size_t i = first; i < settings.size(); i += 2)
      check_sampler(*settings[i].logits, settings[i].p, 50000);
  };
  std::thread other(half, 1);
  half(0);
  other.join();
  std::printf("sampling ok\n");
}

void test_logits_processors() {
  // Penalties (vLLM): repetition over prompt and output tokens (l > 0 ? l / r : l * r),
  // then frequency * count and presence over output tokens; unseen tokens untouched.
  {
    std::vector<float> l = {2.0f, 1.0f, -1.0f, 0.5f, 3.0f};
    SamplingParams p;
    p.repetition_penalty = 2.0f;
    p.frequency_penalty = 0.5f;
    p.presence_penalty = 0.25f;
    TokenCounts counts;
    counts.add_prompt({1, 2});
    for (int32_t t : {2, 3, 3}) counts.add_output(t);
    counts.apply(l.data(), 5, p);
    CHECK((l == std::vector<float>{2.0f, 0.5f, -2.75f, -1.0f, 3.0f}));
    // Negative penalties encourage repetition; repetition_penalty < 1 too.
    std::vector<float> m = {1.0f, 1.0f, -1.0f, 1.0f};
    SamplingParams q;
    q.repetition_penalty = 0.5f;
    q.presence_penalty = -1.0f;
    q.frequency_penalty = -0.5f;
    TokenCounts c2;
    c2.add_prompt({2});
    c2.add_output(1);
    c2.apply(m.data(), 4, q);
    CHECK((m == std::vector<float>{1.0f, 3.5f, -0.5f, 1.0f}));
    // Greedy follows the processed logits.
    Sampler s(1);
    SamplingParams greedy;
    greedy.temperature = 0;
    CHECK(s.sample(l.data(), 5, greedy) == 4);
  }
  // logit_bias adds; -100 all but bans, +100 all but forces (any temperature).
  {
    std::vector<float> l = {2.0f, 1.0f, -1.0f};
    SamplingParams p;
    p.logit_bias = {{0, -100.0f}, {2, 1.5f}};
    apply_logit_bias(l.data(), 3, p);
    CHECK((l == std::vector<float>{-98.0f, 1.0f, 0.5f}));
    std::vector<float> m = {5.0f, 0.0f, 0.0f, 0.0f};
    SamplingParams force;
    force.logit_bias = {{3, 100.0f}};
    apply_logit_bias(m.data(), 4, force);
    Sampler s(2);
    for (int i = 0; i < 1000; ++i) CHECK(s.sample(m.data(), 4, SamplingParams{}) == 3);
  }
  // min_p: weights 1, 0.5, 0.2, 0.05 (temperature 1): min_p 0.3 keeps tokens 0 and 1 only.
  {
    std::vector<float> l = {0.0f, std::log(0.5f), std::log(0.2f), std::log(0.05f)};
    SamplingParams p;
    p.min_p = 0.3f;
    Sampler s(3);
    int seen[4] = {0, 0, 0, 0};
    for (int i = 0; i < 30000; ++i) ++seen[s.sample(l.data(), 4, p)];
    CHECK(seen[2] == 0 && seen[3] == 0);
    CHECK(std::abs(seen[0] / 30000.0 - 2.0 / 3.0) < 0.02);  // 8+ standard deviations
  }
  // Masked rows: greedy and sampled skip -inf; every token masked is an error.
  {
    const float inf = INFINITY;
    std::vector<float> l = {-inf, -inf, 0.5f, -inf};
    Sampler s(4);
    SamplingParams greedy;
    greedy.temperature = 0;
    CHECK(s.sample(l.data(), 4, greedy) == 2);
    for (int i = 0; i < 100; ++i) CHECK(s.sample(l.data(), 4, SamplingParams{}) == 2);
    std::vector<float> none(4, -inf);
    for (const SamplingParams& p : {greedy, SamplingParams{}}) {
      bool threw = false;
      try {
        s.sample(none.data(), 4, p);
      } catch (const std::runtime_error& e) {
        threw = std::string(e.what()).find("masked") != std::string::npos;
      }
      CHECK(threw);
    }
  }
  // Log-softmax and the top alternatives (most likely first, ties by lower id).
  {
    std::vector<float> l = {std::log(1.0f), std::log(4.0f), std::log(2.0f), std::log(1.0f)};
    const LogSoftmax lsm(l.data(), 4);
    CHECK(std::abs(lsm.logprob(1) - std::log(0.5f)) < 1e-6f);
    CHECK(std::abs(lsm.logprob(3) - std::log(0.125f)) < 1e-6f);
    const auto top = lsm.top(3);
    CHECK(top.size() == 3 && top[0].first == 1 && top[1].first == 2 && top[2].first == 0);
    CHECK(lsm.top(0).empty() && lsm.top(10).size() == 4);
    std::vector<float> big(5000);
    std::mt19937 rng(5);
    std::normal_distribution<float> normal(0.0f, 2.0f);
    for (float& x : big) x = normal(rng);
    const auto t20 = LogSoftmax(big.data(), 5000).top(20);
    std::vector<float> sorted = big;
    std::sort(sorted.begin(), sorted.end(), std::greater<float>());
    double norm = 0;
    for (float x : big) norm += std::exp(double(x) - sorted[0]);
    for (int k = 0; k < 20; ++k) {
      CHECK(big[t20[k].first] == sorted[k]);
      CHECK(std::abs(t20[k].second - (sorted[k] - sorted[0] - std::log(norm))) < 1e-5);
    }
  }
  std::printf("processors ok\n");
}

}  // namespace ninfer::fake
