// Internal state of ninfer::Tokenizer, shared by tokenizer.cpp (encode/decode) and
// tokenizer_json.cpp (parsing tokenizer.json).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "text/added_tokens.h"
#include "text/bpe.h"
#include "text/pretokenize.h"

namespace ninfer::detail {

// One element of a TemplateProcessing "single" template: the input sequence ($A) or the ids of
// a special token.
struct TemplatePiece {
  bool is_sequence = false;
  std::vector<int32_t> ids;
};

struct TokenInfo {
  std::string text;   // the token string (added token content or vocabulary entry)
  std::string bytes;  // what the decoder turns it into
  bool exists = false;
  bool special = false;
};

struct TokenizerImpl {
  bool nfc = false;
  tok::PreTokenizer pre_tokenizer;
  std::unique_ptr<tok::BpeModel> model;
  tok::AddedVocabulary added;
  // TemplateProcessing post-processors in application order (ByteLevel ones are no-ops).
  std::vector<std::vector<TemplatePiece>> templates;
  bool byte_level_decoder = false;  // otherwise tokens are joined with spaces, as HF does
  std::vector<TokenInfo> tokens;    // indexed by id
  int32_t vocab_size = 0;

  std::string normalize(std::string_view text) const;
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const;
  const TokenInfo* info(int32_t id) const {
    if (id < 0 || id >= static_cast<int32_t>(tokens.size())) return nullptr;
    const TokenInfo& t = tokens[static_cast<size_t>(id)];
    return t.exists ? &t : nullptr;
  }
  // Fills `tokens` and `vocab_size` from the model and the added vocabulary.
  void index_tokens();

 private:
  void encode_text(std::string_view text, std::vector<int32_t>& ids) const;
};

void parse_tokenizer_json(const nlohmann::json& j, TokenizerImpl& impl);

}  // namespace ninfer::detail
