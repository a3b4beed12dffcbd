#include "engine/ngram.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace ninfer {

NgramDrafter::NgramDrafter(int min_n, int max_n) : min_n_(min_n), max_n_(max_n) {
  if (min_n < 1 || max_n < min_n)
    throw std::invalid_argument("n-gram sizes must satisfy 1 <= min " + std::to_string(min_n) +
                                " <= max " + std::to_string(max_n));
}

// FNV-1a over the n-gram's length and tokens (the length keeps an n-gram and a longer one
// that starts with it apart).
uint64_t NgramDrafter::hash(size_t start, int n) const {
  uint64_t h = 1469598103934665603ull ^ static_cast<uint64_t>(n);
  for (int i = 0; i < n; ++i) {
    h ^= static_cast<uint32_t>(tokens_[start + i]);
    h *= 1099511628211ull;
  }
  return h;
}

bool NgramDrafter::same(size_t a, size_t b, int n) const {
  return std::equal(tokens_.begin() + a, tokens_.begin() + a + n, tokens_.begin() + b);
}

void NgramDrafter::append(int32_t token) {
  tokens_.push_back(token);
  // The n-grams ending at the token before this one now have a token after them.
  const size_t end = tokens_.size() - 1;  // one past the n-grams' last token
  for (int n = min_n_; n <= max_n_ && static_cast<size_t>(n) <= end; ++n)
    first_.emplace(hash(end - n, n), static_cast<uint32_t>(end - n));  // keeps the first
}

std::vector<int32_t> NgramDrafter::propose(int k) const {
  const size_t len = tokens_.size();
  if (k <= 0) return {};
  for (int n = std::min<size_t>(max_n_, len); n >= min_n_; --n) {
    const size_t suffix = len - n;
    auto it = first_.find(hash(suffix, n));
    if (it == first_.end() || !same(it->second, suffix, n)) continue;  // none, or a collision
    const size_t from = it->second + n;
    const size_t to = std::min(len, from + static_cast<size_t>(k));
    return {tokens_.begin() + from, tokens_.begin() + to};
  }
  return {};
}

}  // namespace ninfer
