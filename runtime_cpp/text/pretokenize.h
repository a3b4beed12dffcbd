// Pre-tokenization: the `Split` and `ByteLevel` pre-tokenizers of Hugging Face tokenizers,
// applied in sequence to a piece of normalized text.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "text/pcre2_regex.h"

namespace ninfer::tok {

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// Splits `text` around the matches of `regex` (with `invert`, around the non-matches) as
// NormalizedString::split does; returns the non-empty pieces as [start, end) byte offsets.
std::vector<std::pair<size_t, size_t>> split_text(std::string_view text, const Regex& regex,
                                                  SplitBehavior behavior, bool invert);

struct PreTokenizerStep {
  enum class Kind { kByteLevel, kSplit };
  Kind kind = Kind::kByteLevel;
  // ByteLevel
  bool add_prefix_space = false;
  bool use_regex = true;
  // Split
  std::shared_ptr<const Regex> regex;
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
};

class PreTokenizer {
 public:
  std::vector<PreTokenizerStep> steps;

  // Appends the pre-tokens of `text` (non-empty) to `out`.
  void run(std::string_view text, std::vector<std::string>& out) const;
};

// The GPT-2 pattern ByteLevel uses when use_regex is true.
const Regex& gpt2_regex();

}  // namespace ninfer::tok
