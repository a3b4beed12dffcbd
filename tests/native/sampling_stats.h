// The exact distribution Sampler::sample draws from (computed by a full sort, independent
// of the sampler's partial selection) and Pearson's chi-square of draws against it, held
// to its upper 1e-6 tail: a correct sampler passes for any seed, while a slightly wrong
// temperature, a top-p cut one token off or a bias towards the front of the candidate list
// moves the statistic by orders of magnitude at 10^5 draws. Cells expected to hold fewer
// than 5 draws are pooled into one; a draw outside the distribution's support fails at
// once. Shared by test_sampling.cpp and test_speculate.cpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "check.h"
#include "engine/sampling.h"

namespace ninfer::fake {

// Upper 1e-6 quantile of chi-square with `df` degrees of freedom (Wilson-Hilferty; for a
// few degrees of freedom it errs high, i.e. lenient by a little).
inline double chi_square_bound(int df) {
  const double z = 4.753;  // standard normal, upper 1e-6
  const double k = 2.0 / (9.0 * df);
  return df * std::pow(1 - k + z * std::sqrt(k), 3);
}

// Token probabilities after temperature, min_p, top_k and top_p (sampled rows).
inline std::vector<double> exact_distribution(const std::vector<float>& logits,
                                              const SamplingParams& p) {
  const int vocab = static_cast<int>(logits.size());
  std::vector<int> order(vocab);
  for (int i = 0; i < vocab; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  const int k = p.top_k > 0 ? std::min(p.top_k, vocab) : vocab;
  std::vector<double> w(k);
  double total = 0;
  for (int i = 0; i < k; ++i) {
    w[i] = std::exp((logits[order[i]] - logits[order[0]]) / p.temperature);
    if (w[i] < p.min_p) w[i] = 0;  // below min_p times the top token's probability
    total += w[i];
  }
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
  return want;
}

// Fails (naming `what`) when the counts `seen` of `draws` draws do not follow `want`.
inline void check_draws(const std::vector<int>& seen, const std::vector<double>& want, int draws,
                        const std::string& what) {
  double chi2 = 0, pooled_expected = 0, pooled_seen = 0;
  int cells = 0, support = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (seen[i] > 0 && want[i] == 0)
      fail(what + ": drew token " + std::to_string(i) + ", which has probability 0");
    if (want[i] == 0) continue;
    ++support;
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
  if (support == 1) return;  // one outcome, and nothing was drawn outside it
  if (cells < 2) fail(what + ": too few draws for a chi-square test");
  const double bound = chi_square_bound(cells - 1);
  if (chi2 > bound)
    fail(what + ": chi-square " + std::to_string(chi2) + " > " + std::to_string(bound) + " (" +
         std::to_string(cells - 1) + " degrees of freedom)");
}

}  // namespace ninfer::fake
