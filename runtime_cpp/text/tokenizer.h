// Byte-level BPE tokenizer that reads a Hugging Face tokenizer.json and reproduces
// `tokenizers` exactly (encode ids, decode text). Model independent; used by ninfer-server.
//
// Supported components: normalizer none / NFC / Sequence; pre-tokenizers ByteLevel, Split
// (Regex or String pattern, every behavior, invert) and Sequence; model BPE; post-processors
// none / ByteLevel / TemplateProcessing / Sequence; decoder none / ByteLevel. Anything else is
// rejected by from_json with a std::runtime_error naming the component.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ninfer {

namespace detail {
struct TokenizerImpl;
}

class Tokenizer {
 public:
  // Parses the contents of a Hugging Face tokenizer.json. Throws std::runtime_error whose
  // message names the unsupported component (e.g. "tokenizer.json: normalizer type
  // 'Lowercase' is not supported (supported: none, NFC, Sequence)").
  static Tokenizer from_json(const nlohmann::json& tokenizer_json);

  // Thread-safe. `text` must be valid UTF-8 (std::invalid_argument otherwise).
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const;
  // Lossy UTF-8 exactly like HF: unknown ids are skipped, invalid bytes become U+FFFD.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const;
  // Raw bytes of one token after the byte-level decoder (std::out_of_range for unknown ids).
  std::string token_bytes(int32_t id) const;
  bool is_special(int32_t id) const;
  int32_t vocab_size() const;  // max id + 1 over vocab and added tokens
  std::optional<int32_t> token_to_id(std::string_view token) const;  // vocab or added token

 private:
  friend class StreamDecoder;
  explicit Tokenizer(std::shared_ptr<const detail::TokenizerImpl> impl);
  std::shared_ptr<const detail::TokenizerImpl> impl_;
};

// Streaming detokenizer: push ids one by one, get back only complete UTF-8 text; flush() at end
// returns the remainder with invalid bytes replaced exactly as decode() would. The
// concatenation of all outputs equals decode() of all pushed ids.
class StreamDecoder {
 public:
  StreamDecoder(const Tokenizer& tok, bool skip_special_tokens);
  std::string push(int32_t id);
  std::string flush();

 private:
  std::shared_ptr<const detail::TokenizerImpl> impl_;
  bool skip_special_tokens_;
  bool emitted_ = false;  // for decoders that join tokens with spaces
  std::string pending_;   // bytes of an incomplete UTF-8 sequence
};

}  // namespace ninfer
