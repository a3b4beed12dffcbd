#include "text/tokenizer.h"

#include <algorithm>
#include <stdexcept>

#include "text/tokenizer_impl.h"
#include "text/unicode/nfc.h"
#include "text/utf8.h"

namespace ninfer {
namespace detail {

std::string TokenizerImpl::normalize(std::string_view text) const {
  return nfc ? unicode::nfc(text) : std::string(text);
}

void TokenizerImpl::encode_text(std::string_view text, std::vector<int32_t>& ids) const {
  std::vector<std::string> words;
  pre_tokenizer.run(text, words);
  for (const auto& word : words) model->tokenize(word, ids);
}

std::vector<int32_t> TokenizerImpl::encode(std::string_view text, bool add_special_tokens) const {
  if (!utf8::is_valid(text)) {
    throw std::invalid_argument("Tokenizer::encode: text is not valid UTF-8");
  }
  std::vector<int32_t> ids;
  // Tokens matched on the raw text first, then tokens matched on the normalized rest.
  for (const auto& raw : added.split(text, false)) {
    if (raw.id >= 0) {
      ids.push_back(raw.id);
      continue;
    }
    const std::string normalized = normalize(text.substr(raw.start, raw.end - raw.start));
    const std::string_view view = normalized;
    for (const auto& seg : added.split(view, true)) {
      if (seg.id >= 0) {
        ids.push_back(seg.id);
      } else {
        encode_text(view.substr(seg.start, seg.end - seg.start), ids);
      }
    }
  }
  if (!add_special_tokens) return ids;
  for (const auto& pieces : templates) {
    std::vector<int32_t> wrapped;
    wrapped.reserve(ids.size() + 4);
    for (const auto& piece : pieces) {
      const auto& src = piece.is_sequence ? ids : piece.ids;
      wrapped.insert(wrapped.end(), src.begin(), src.end());
    }
    ids.swap(wrapped);
  }
  return ids;
}

void TokenizerImpl::index_tokens() {
  int32_t max_id = -1;
  for (const auto& [text, id] : model->vocab()) max_id = std::max(max_id, id);
  for (const auto& [id, token] : added.by_id()) max_id = std::max(max_id, id);
  vocab_size = max_id + 1;
  tokens.assign(static_cast<size_t>(vocab_size), TokenInfo{});
  for (const auto& [text, id] : model->vocab()) {
    if (id < 0) continue;
    tokens[static_cast<size_t>(id)].text = text;
    tokens[static_cast<size_t>(id)].exists = true;
  }
  for (const auto& [id, token] : added.by_id()) {
    tokens[static_cast<size_t>(id)].text = token.content;  // added tokens take precedence
    tokens[static_cast<size_t>(id)].exists = true;
  }
  for (auto& t : tokens) {
    if (!t.exists) continue;
    t.special = added.is_special_content(t.text);
    t.bytes = t.text;
    if (!byte_level_decoder) continue;
    // ByteLevel decoder: map every character back to its byte; a token with a character
    // outside the byte alphabet is kept as its raw UTF-8 instead.
    std::string bytes;
    bool all_mapped = true;
    for (size_t i = 0; i < t.text.size() && all_mapped;) {
      const int b = utf8::unicode_to_byte(utf8::next(t.text, i));
      all_mapped = b >= 0;
      bytes += static_cast<char>(b);
    }
    if (all_mapped) t.bytes = std::move(bytes);
  }
}

}  // namespace detail

Tokenizer::Tokenizer(std::shared_ptr<const detail::TokenizerImpl> impl) : impl_(std::move(impl)) {}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  return impl_->encode(text, add_special_tokens);
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  std::string joined;
  bool first = true;
  for (int32_t id : ids) {
    const detail::TokenInfo* t = impl_->info(id);
    if (t == nullptr || (skip_special_tokens && t->special)) continue;
    if (!impl_->byte_level_decoder && !first) joined += ' ';
    joined += t->bytes;
    first = false;
  }
  if (!impl_->byte_level_decoder) return joined;
  std::string out;
  utf8::decode_lossy(joined, true, out);
  return out;
}

std::string Tokenizer::token_bytes(int32_t id) const {
  const detail::TokenInfo* t = impl_->info(id);
  if (t == nullptr)
    throw std::out_of_range("Tokenizer::token_bytes: unknown id " + std::to_string(id));
  return t->bytes;
}

bool Tokenizer::is_special(int32_t id) const {
  const detail::TokenInfo* t = impl_->info(id);
  return t != nullptr && t->special;
}

int32_t Tokenizer::vocab_size() const { return impl_->vocab_size; }

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto id = impl_->added.id_of(token)) return id;
  return impl_->model->token_to_id(token);
}

StreamDecoder::StreamDecoder(const Tokenizer& tok, bool skip_special_tokens)
    : impl_(tok.impl_), skip_special_tokens_(skip_special_tokens) {}

std::string StreamDecoder::push(int32_t id) {
  const detail::TokenInfo* t = impl_->info(id);
  if (t == nullptr || (skip_special_tokens_ && t->special)) return {};
  if (!impl_->byte_level_decoder) {
    std::string out = emitted_ ? " " + t->bytes : t->bytes;
    emitted_ = true;
    return out;
  }
  pending_ += t->bytes;
  std::string out;
  const size_t consumed = utf8::decode_lossy(pending_, false, out);
  pending_.erase(0, consumed);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out;
  utf8::decode_lossy(pending_, true, out);
  pending_.clear();
  return out;
}

}  // namespace ninfer
