#include "text/added_tokens.h"

#include <algorithm>

#include "text/pcre2_regex.h"
#include "text/utf8.h"

namespace ninfer::tok {
namespace {

// Rust regex `\w` (what HF's single_word checks use): Alphabetic, marks, decimal digits,
// connector punctuation, join controls.
bool is_word_char(std::string_view ch) {
  static const Regex word("\\A[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}]\\z",
                          "added token word matcher");
  return word.contains_match(ch);
}

bool ends_with_word(std::string_view text) {
  if (text.empty()) return false;
  size_t start = text.size() - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  return is_word_char(text.substr(start));
}

bool starts_with_word(std::string_view text) {
  if (text.empty()) return false;
  return is_word_char(text.substr(0, utf8::sequence_length(static_cast<unsigned char>(text[0]))));
}

// Byte offset where the trailing run of white space of `text` starts.
size_t trailing_space_start(std::string_view text) {
  size_t start = text.size();
  size_t i = 0;
  while (i < text.size()) {
    const size_t at = i;
    if (!utf8::is_white_space(utf8::next(text, i))) start = text.size();
    else if (start == text.size()) start = at;
  }
  return start;
}

// Byte length of the leading run of white space of `text`.
size_t leading_space_length(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    size_t j = i;
    if (!utf8::is_white_space(utf8::next(text, j))) break;
    i = j;
  }
  return i;
}

}  // namespace

void AddedVocabulary::Trie::insert(std::string_view pattern, int32_t id) {
  int32_t node = 0;
  for (char c : pattern) {
    const auto byte = static_cast<unsigned char>(c);
    auto it = nodes[node].next.find(byte);
    if (it == nodes[node].next.end()) {
      nodes.emplace_back();
      it = nodes[node].next.emplace(byte, static_cast<int32_t>(nodes.size() - 1)).first;
    }
    node = it->second;
  }
  first_byte[static_cast<unsigned char>(pattern[0])] = true;
  // Several patterns with one content map to one id (HF looks ids up by content).
  if (nodes[node].token_id < 0) nodes[node].token_id = id;
}

int32_t AddedVocabulary::Trie::longest_at(std::string_view text, size_t pos, size_t& len) const {
  int32_t best = -1;
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    const auto it = nodes[node].next.find(static_cast<unsigned char>(text[i]));
    if (it == nodes[node].next.end()) break;
    node = it->second;
    if (nodes[node].token_id >= 0) {
      best = nodes[node].token_id;
      len = i + 1 - pos;
    }
  }
  return best;
}

void AddedVocabulary::add(const AddedToken& token, const ModelLookup& model_lookup,
                          size_t model_size) {
  if (token.special && !token.content.empty() && special_set_.count(token.content) == 0) {
    special_tokens_.push_back(token);
    special_set_.insert(token.content);
  }
  if (token.content.empty()) return;
  for (const auto& [id, existing] : by_id_) {
    if (existing == token) return;
  }
  int32_t new_id;
  if (auto id = id_of(token.content)) {
    new_id = *id;
  } else if (auto model_id = model_lookup(token.content)) {
    new_id = *model_id;
  } else if (by_content_.empty()) {
    new_id = static_cast<int32_t>(model_size);
  } else {
    int32_t max_id = 0;
    for (const auto& entry : by_content_) max_id = std::max(max_id, entry.second);
    const bool past_model = max_id >= static_cast<int32_t>(model_size) || model_size == 0;
    new_id = past_model ? max_id + 1 : static_cast<int32_t>(model_size);
  }
  by_content_[token.content] = new_id;
  by_id_[new_id] = token;
  if (special_set_.count(token.content) == 0) plain_tokens_.push_back(token);
}

void AddedVocabulary::build(const Normalize& normalize) {
  raw_trie_ = Trie{};
  normalized_trie_ = Trie{};
  auto insert = [&](const AddedToken& token) {
    const int32_t id = *id_of(token.content);
    if (!token.normalized) {
      raw_trie_.insert(token.content, id);
      return;
    }
    const std::string pattern = normalize ? normalize(token.content) : token.content;
    if (!pattern.empty()) normalized_trie_.insert(pattern, id);
  };
  for (const auto& token : special_tokens_) insert(token);
  for (const auto& token : plain_tokens_) insert(token);
}

std::optional<int32_t> AddedVocabulary::id_of(std::string_view content) const {
  const auto it = by_content_.find(std::string(content));
  if (it == by_content_.end()) return std::nullopt;
  return it->second;
}

std::vector<Segment> AddedVocabulary::split(std::string_view text, bool normalized_set) const {
  const Trie& trie = normalized_set ? normalized_trie_ : raw_trie_;
  std::vector<Segment> segments;
  size_t start_offset = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t len = 0;
    const int32_t id = trie.first_byte[static_cast<unsigned char>(text[pos])]
                           ? trie.longest_at(text, pos, len)
                           : -1;
    if (id < 0) {
      ++pos;
      continue;
    }
    size_t start = pos;
    size_t stop = pos + len;
    pos = stop;  // matches never overlap, even when one is discarded below
    const AddedToken& token = by_id_.at(id);
    if (token.single_word) {
      const bool start_space = start == 0 || !ends_with_word(text.substr(0, start));
      const bool stop_space = stop == text.size() || !starts_with_word(text.substr(stop));
      if (!start_space || !stop_space) continue;
    }
    if (token.lstrip) start = std::max(trailing_space_start(text.substr(0, start)), start_offset);
    if (token.rstrip) stop += leading_space_length(text.substr(stop));
    if (start_offset < start) segments.push_back({start_offset, start, -1});
    segments.push_back({start, stop, id});
    start_offset = stop;
  }
  if (start_offset < text.size()) segments.push_back({start_offset, text.size(), -1});
  return segments;
}

}  // namespace ninfer::tok
