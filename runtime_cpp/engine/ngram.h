// Prompt-lookup (n-gram) drafts for speculative decoding: the tokens that followed an
// earlier occurrence of the sequence's last n tokens. The rule is vLLM's ngram proposer's:
// the longest n-gram of min_n..max_n tokens that ends at the last token and occurred
// before, at its earliest occurrence, proposes up to k of the tokens after it (fewer when
// the sequence ends sooner; none when nothing matches).
//
// The index is kept as the sequence grows: the first occurrence of every n-gram
// (min_n <= n <= max_n) that has a token after it, by a 64-bit hash of its tokens and
// checked against them, so a proposal costs max_n - min_n + 1 lookups whatever the length
// of the context, and appending a token max_n - min_n + 1 insertions. Only accepted tokens
// are appended: drafts never enter the index.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "engine/drafter.h"

namespace ninfer {

class NgramDrafter : public Drafter {
 public:
  // 1 <= min_n <= max_n; throws std::invalid_argument otherwise.
  NgramDrafter(int min_n, int max_n);
  void append(int32_t token) override;
  // Up to k draft tokens (k >= 0) for the position after the last token.
  std::vector<int32_t> propose(int k) const override;
  size_t size() const { return tokens_.size(); }

 private:
  uint64_t hash(size_t start, int n) const;
  bool same(size_t a, size_t b, int n) const;
  int min_n_, max_n_;
  std::vector<int32_t> tokens_;
  std::unordered_map<uint64_t, uint32_t> first_;  // hash of an n-gram -> its first start
};

}  // namespace ninfer
