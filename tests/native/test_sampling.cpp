// Sampler: empirical frequencies against the exact top-k / top-p / temperature
// distribution (computed here by a full sort), on a 1000-token vocabulary whose mass
// spreads over hundreds of tokens, so that the top-p prefix search grows several times.
// The 16 settings are checked on two threads (each with its own seeded sampler).
//
// The comparison is Pearson's chi-square over the kept tokens (cells expected to hold
// fewer than 5 draws pooled into one), held to its upper 1e-6 tail: a correct sampler
// passes for any seed, while a slightly wrong temperature, a top-p cut one token off or a
// bias towards the front of the candidate list moves the statistic by orders of
// magnitude at 200,000 draws. A token outside the kept set fails at once.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine/sampling.h"
#include "harness.h"

namespace ninfer::fake {
namespace {

// Upper 1e-6 quantile of chi-square with `df` degrees of freedom (Wilson-Hilferty; for a
// few degrees of freedom it errs high, i.e. lenient by a little).
double chi_square_bound(int df) {
  const double z = 4.753;  // standard normal, upper 1e-6
  const double k = 2.0 / (9.0 * df);
  return df * std::pow(1 - k + z * std::sqrt(k), 3);
}

void check_sampler(const std::vector<float>& logits, const SamplingParams& p, int draws) {
  const int vocab = static_cast<int>(logits.size());
  std::vector<int> order(vocab);
  for (int i = 0; i < vocab; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  const int k = p.top_k > 0 ? std::min(p.top_k, vocab) : vocab;
  std::vector<double> w(k);
  double total = 0;
  for (int i = 0; i < k; ++i)
    total += w[i] = std::exp((logits[order[i]] - logits[order[0]]) / p.temperature);
  int keep = k;
  double cum = 0;
  for (int i = 0; i < k && p.top_p < 1.0f; ++i) {
    cum += w[i] / total;
    if (cum >= p.top_p) {
      keep = i + 1;
      break;
    }
  }
  double kept = 0;
  for (int i = 0; i < keep; ++i) kept += w[i];
  std::vector<double> want(vocab, 0.0);
  for (int i = 0; i < keep; ++i) want[order[i]] = w[i] / kept;
  std::vector<int> seen(vocab, 0);
  Sampler sampler(1234);
  for (int d = 0; d < draws; ++d) ++seen[sampler.sample(logits.data(), vocab, p)];
  double chi2 = 0, pooled_expected = 0, pooled_seen = 0;
  int cells = 0;
  for (int i = 0; i < vocab; ++i) {
    if (seen[i] > 0 && want[i] == 0)
      fail("sampled token " + std::to_string(i) + " outside the kept set");
    if (want[i] == 0) continue;
    const double expected = want[i] * draws;
    if (expected < 5) {
      pooled_expected += expected;
      pooled_seen += seen[i];
      continue;
    }
    chi2 += (seen[i] - expected) * (seen[i] - expected) / expected;
    ++cells;
  }
  if (pooled_expected > 0) {
    chi2 += (pooled_seen - pooled_expected) * (pooled_seen - pooled_expected) / pooled_expected;
    ++cells;
  }
  if (cells < 2) {  // one outcome: it must be all of them
    CHECK(seen[order[0]] == draws);
    return;
  }
  const double bound = chi_square_bound(cells - 1);
  if (chi2 > bound)
    fail("sampler: chi-square " + std::to_string(chi2) + " > " + std::to_string(bound) + " (" +
         std::to_string(cells - 1) + " degrees of freedom, keep " + std::to_string(keep) +
         ", top_p " + std::to_string(p.top_p) + ", top_k " + std::to_string(p.top_k) +
         ", temperature " + std::to_string(p.temperature) + ")");
}

}  // namespace

void test_sampling() {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  std::vector<float> logits(1000);
  for (float& x : logits) x = normal(rng);
  std::vector<SamplingParams> settings;
  for (float top_p : {1.0f, 0.95f, 0.5f, 0.05f})
    for (int top_k : {0, 40})
      for (float temperature : {1.0f, 0.7f}) {
        SamplingParams p;
        p.top_p = top_p;
        p.top_k = top_k;
        p.temperature = temperature;
        settings.push_back(p);
      }
  // fail() exits the process, so a failure on either thread ends the test with its message.
  auto half = [&](size_t first) {
    for (size_t i = first; i < settings.size(); i += 2) check_sampler(logits, settings[i], 200000);
  };
  std::thread other(half, 1);
  half(0);
  other.join();
  std::printf("sampling ok\n");
}

}  // namespace ninfer::fake
