// Added tokens (tokenizer.json "added_tokens"): id assignment and text splitting exactly as
// Hugging Face tokenizers' AddedVocabulary does it.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace ninfer::tok {

struct AddedToken {
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool special = false;

  bool operator==(const AddedToken& o) const {
    return content == o.content && single_word == o.single_word && lstrip == o.lstrip &&
           rstrip == o.rstrip && normalized == o.normalized && special == o.special;
  }
};

// A piece of text: either an added token (id >= 0) or plain text (id == -1), as byte offsets.
struct Segment {
  size_t start;
  size_t end;
  int32_t id;
};

class AddedVocabulary {
 public:
  using ModelLookup = std::function<std::optional<int32_t>(std::string_view)>;
  using Normalize = std::function<std::string(std::string_view)>;

  // Adds one token the way HF replays tokenizer.json: the id stored in the file is ignored and
  // the token gets its vocabulary id if it has one, else the next free id after the model's.
  void add(const AddedToken& token, const ModelLookup& model_lookup, size_t model_size);

  // Builds the matchers once all tokens are added; `normalize` (may be empty) is applied to
  // the content of tokens with normalized=true.
  void build(const Normalize& normalize);

  // Splits `text` on the tokens with normalized == `normalized_set` (leftmost-longest, with the
  // single_word / lstrip / rstrip rules). Covers the whole text; empty text gives no segment.
  std::vector<Segment> split(std::string_view text, bool normalized_set) const;

  std::optional<int32_t> id_of(std::string_view content) const;
  // Token string and specialness by id, for decoding.
  const std::unordered_map<int32_t, AddedToken>& by_id() const { return by_id_; }
  bool is_special_content(const std::string& content) const {
    return special_set_.count(content) > 0;
  }

 private:
  struct Trie {
    struct Node {
      std::unordered_map<unsigned char, int32_t> next;
      int32_t token_id = -1;
    };
    std::vector<Node> nodes{Node{}};
    bool first_byte[256] = {};
    void insert(std::string_view pattern, int32_t id);
    // Longest pattern starting at `pos`: returns its id and sets `len`, or -1.
    int32_t longest_at(std::string_view text, size_t pos, size_t& len) const;
  };

  std::unordered_map<std::string, int32_t> by_content_;
  std::unordered_map<int32_t, AddedToken> by_id_;
  std::vector<AddedToken> special_tokens_;  // in insertion order
  std::vector<AddedToken> plain_tokens_;
  std::unordered_set<std::string> special_set_;
  Trie raw_trie_;
  Trie normalized_trie_;
};

}  // namespace ninfer::tok
