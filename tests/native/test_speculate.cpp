// Speculative decoding's host pieces: the n-gram drafter (engine/ngram.h) against its
// rule, and a brute-force scan over random sequences; Sampler::verify (engine/sampling.h):
// greedy rows accept exactly the argmax, and in sampled rows the position's output follows
// the distribution sample() draws from, whatever the draft: a likely, an unlikely and an
// impossible draft proposed with certainty (q a point mass, as n-gram drafts are) and drafts
// drawn from a draft distribution q (as a draft model's are), after temperature, top_p,
// top_k, min_p and the penalties, 100,000 verifications each (sampling_stats.h's
// chi-square), and a certain draft is accepted at the rate p(draft).
#include <cmath>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/ngram.h"
#include "engine/sampling.h"
#include "harness.h"
#include "sampling_stats.h"

namespace ninfer::fake {
namespace {

// The rule, by brute force: the longest n in [lo, hi] whose suffix n-gram occurs earlier
// (ending before the last token), at its earliest start; up to k tokens after it.
std::vector<int32_t> scan(const std::vector<int32_t>& t, int lo, int hi, int k) {
  const int len = static_cast<int>(t.size());
  for (int n = std::min(hi, len); n >= lo; --n)
    for (int i = 0; i + n <= len - 1; ++i) {
      bool match = true;
      for (int j = 0; j < n && match; ++j) match = t[i + j] == t[len - n + j];
      if (match) return {t.begin() + i + n, t.begin() + std::min(len, i + n + k)};
    }
  return {};
}

void test_ngram() {
  using V = std::vector<int32_t>;
  NgramDrafter d(2, 3);
  d.extend({1, 2, 3, 4, 2, 3});         // vLLM's example: [4, 2, 3] does not recur, [2, 3] does
  CHECK(d.propose(4) == (V{4, 2, 3}));  // only three tokens follow the match
  CHECK(d.propose(1) == (V{4}));
  CHECK(d.propose(0).empty());
  d.append(9);  // [3, 9] and [9] never occurred
  CHECK(d.propose(4).empty());
  NgramDrafter longest(1, 3);
  // [7, 8] recurs at 0 (followed by 1) and [6, 7, 8] at 4 (followed by 2): the longer wins
  longest.extend({7, 8, 1, 0, 6, 7, 8, 2, 5, 6, 7, 8});
  CHECK(longest.propose(2) == (V{2, 5}));
  NgramDrafter earliest(2, 2);
  earliest.extend({5, 6, 1, 5, 6, 2, 5, 6});  // [5, 6] at 0 and at 3: the earliest
  CHECK(earliest.propose(3) == (V{1, 5, 6}));
  NgramDrafter run(1, 4);
  run.extend({3, 3, 3, 3});  // overlapping occurrences: [3, 3, 3] at 0 is followed by 3
  CHECK(run.propose(5) == (V{3}));
  bool threw = false;
  try {
    NgramDrafter bad(3, 2);
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  CHECK(threw);
  std::mt19937 rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    const int vocab = 2 + trial % 7, lo = 1 + trial % 3, hi = lo + trial % 4;
    NgramDrafter drafter(lo, hi);
    std::vector<int32_t> tokens;
    std::uniform_int_distribution<int32_t> token(0, vocab - 1);
    for (int i = 0; i < 60; ++i) {
      const int32_t t = token(rng);
      tokens.push_back(t);
      drafter.append(t);
      for (int k : {1, 3, 8})
        if (drafter.propose(k) != scan(tokens, lo, hi, k))
          fail("n-gram draft differs from the scan at length " + std::to_string(tokens.size()));
    }
  }
}

// The position's output over `draws` verifications of drafts (`fixed_draft` proposed with
// certainty, or drawn from `q` when given), against exact_distribution; returns the
// acceptance rate.
double check_verify(const std::vector<float>& logits, const SamplingParams& p, int draws,
                    int32_t fixed_draft, const std::vector<float>* q, const std::string& what) {
  const int vocab = static_cast<int>(logits.size());
  const std::vector<double> want = exact_distribution(logits, p);
  std::vector<int> seen(vocab, 0);
  Sampler sampler(99);
  std::mt19937_64 draft_rng(5);
  std::discrete_distribution<int32_t> from_q;
  if (q) from_q = std::discrete_distribution<int32_t>(q->begin(), q->end());
  int accepted = 0;
  for (int i = 0; i < draws; ++i) {
    const int32_t draft = q ? from_q(draft_rng) : fixed_draft;
    const DraftVerdict v = sampler.verify(logits.data(), vocab, p, draft, q ? q->data() : nullptr);
    CHECK(!v.accepted || v.token == draft);
    accepted += v.accepted;
    ++seen[v.token];
  }
  check_draws(seen, want, draws, what);
  return static_cast<double>(accepted) / draws;
}

void test_verify() {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  const int vocab = 300;
  std::vector<float> logits(vocab);
  for (float& x : logits) x = normal(rng);
  // Greedy: the argmax, accepted iff drafted.
  Sampler greedy(1);
  SamplingParams g;
  g.temperature = 0;
  const int32_t best = argmax(logits.data(), vocab);
  for (int32_t draft : {best, (best + 1) % vocab}) {
    const DraftVerdict v = greedy.verify(logits.data(), vocab, g, draft);
    CHECK(v.token == best && v.accepted == (draft == best));
  }
  // A draft distribution of its own (a softened copy of the logits, shifted).
  std::vector<float> q(vocab);
  double qs = 0;
  for (int i = 0; i < vocab; ++i) qs += q[i] = std::exp(0.5 * logits[(i + 7) % vocab]);
  for (float& x : q) x = static_cast<float>(x / qs);
  std::vector<SamplingParams> settings(5);
  settings[1].temperature = 0.7f;
  settings[1].top_p = 0.9f;
  settings[2].top_k = 20;
  settings[2].temperature = 1.3f;
  settings[3].min_p = 0.1f;
  settings[3].temperature = 0.8f;
  settings[4].repetition_penalty = 1.3f;  // penalties change the logits before the sampler
  settings[4].frequency_penalty = 0.5f;
  settings[4].presence_penalty = 0.4f;
  settings[4].top_p = 0.95f;
  TokenCounts counts;
  counts.add_prompt({best, 5, 17});
  for (int32_t t : {best, best, 40}) counts.add_output(t);
  constexpr int kDraws = 100000;
  for (size_t s = 0; s < settings.size(); ++s) {
    const SamplingParams& p = settings[s];
    std::vector<float> row = logits;
    if (p.has_penalties()) counts.apply(row.data(), vocab, p);
    const std::vector<double> want = exact_distribution(row, p);
    int32_t likely = 0, unlikely = -1, impossible = -1;
    for (int i = 0; i < vocab; ++i) {
      if (want[i] > want[likely]) likely = i;
      if (want[i] > 0 && (unlikely < 0 || want[i] < want[unlikely])) unlikely = i;
      if (want[i] == 0) impossible = i;
    }
    const std::string what = "verify setting " + std::to_string(s);
    for (int32_t draft : {likely, unlikely, impossible}) {
      if (draft < 0) continue;  // every token possible: no impossible draft to try
      const double rate =
          check_verify(row, p, kDraws, draft, nullptr, what + ", draft " + std::to_string(draft));
      // accepted with probability p(draft): within 5 standard deviations
      const double sd = std::sqrt(want[draft] * (1 - want[draft]) / kDraws);
      if (std::abs(rate - want[draft]) > 5 * sd + 1e-9)
        fail(what + ": acceptance " + std::to_string(rate) + " for p(draft) " +
             std::to_string(want[draft]));
    }
    check_verify(row, p, kDraws, 0, &q, what + ", drafts from q");
  }
}

}  // namespace

void test_speculate() {
  test_ngram();
  test_verify();
  std::printf("speculate ok\n");
}

}  // namespace ninfer::fake
