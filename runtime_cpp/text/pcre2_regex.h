// PCRE2-backed regex with the matching semantics Hugging Face tokenizers gets from Oniguruma:
// patterns are translated so that `\s`, `\w`, `\h` and the Unicode categories mean what they
// mean in Oniguruma, and find_all() enumerates matches like the `onig` crate's find_iter.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ninfer::tok {

// Rewrites an Oniguruma (Ruby syntax) pattern into an equivalent PCRE2 pattern.
std::string translate_oniguruma_pattern(std::string_view pattern);

// A pattern that matches `literal` exactly.
std::string escape_literal(std::string_view literal);

class Regex {
 public:
  // Compiles `pcre2_pattern` with PCRE2_UTF | PCRE2_UCP (and JIT when available).
  // Throws std::runtime_error naming `what` when the pattern does not compile.
  Regex(const std::string& pcre2_pattern, const std::string& what);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Non-overlapping matches as [start, end) byte offsets. `subject` must be valid UTF-8.
  // An empty match right where the previous match ended is skipped (onig's find_iter rule).
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view subject) const;

  // True if the pattern matches anywhere in `subject` (valid UTF-8).
  bool contains_match(std::string_view subject) const;

 private:
  bool search(std::string_view subject, size_t offset, void* match_data, size_t& start,
              size_t& end) const;
  void* code_;  // pcre2_code_8*
};

}  // namespace ninfer::tok
