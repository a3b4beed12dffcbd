#include "server/logprobs_json.h"

#include <cmath>
#include <string>

namespace ninfer {

using nlohmann::json;

namespace {

struct Piece {
  std::string text;   // decoded (U+FFFD for a partial character)
  std::string bytes;  // raw bytes
};

Piece piece(const Tokenizer& tok, int32_t id, bool as_ids) {
  Piece p;
  if (as_ids) {
    p.text = p.bytes = "token_id:" + std::to_string(id);
    return p;
  }
  p.text = tok.decode({id}, /*skip_special_tokens=*/false);
  try {
    p.bytes = tok.token_bytes(id);
  } catch (const std::exception&) {
    p.bytes = p.text;
  }
  return p;
}

json byte_list(const std::string& s) {
  json out = json::array();
  for (unsigned char c : s) out.push_back(static_cast<int>(c));
  return out;
}

// JSON has no -infinity; vLLM writes -9999.0 for it.
double finite(float x) { return std::isfinite(x) ? x : -9999.0; }

size_t characters(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

}  // namespace

json chat_logprobs_json(const Tokenizer& tok, const std::vector<TokenLogprob>& lps, bool as_ids) {
  json content = json::array();
  for (const TokenLogprob& lp : lps) {
    const Piece p = piece(tok, lp.token, as_ids);
    json top = json::array();
    for (const auto& [id, logprob] : lp.top) {
      const Piece q = piece(tok, id, as_ids);
      top.push_back(
          {{"token", q.text}, {"logprob", finite(logprob)}, {"bytes", byte_list(q.bytes)}});
    }
    content.push_back({{"token", p.text},
                       {"logprob", finite(lp.logprob)},
                       {"bytes", byte_list(p.bytes)},
                       {"top_logprobs", top}});
  }
  return {{"content", content}, {"refusal", nullptr}};
}

json completion_logprobs_json(const Tokenizer& tok, const std::vector<TokenLogprob>& lps,
                              size_t& offset, bool as_ids) {
  json tokens = json::array(), logprobs = json::array(), tops = json::array(),
       offsets = json::array();
  for (const TokenLogprob& lp : lps) {
    const Piece p = piece(tok, lp.token, as_ids);
    tokens.push_back(p.text);
    logprobs.push_back(finite(lp.logprob));
    json top = json::object();
    for (const auto& [id, logprob] : lp.top) top[piece(tok, id, as_ids).text] = finite(logprob);
    if (!top.contains(p.text)) top[p.text] = finite(lp.logprob);
    tops.push_back(top);
    offsets.push_back(offset);
    offset += characters(p.text);
  }
  return {{"tokens", tokens},
          {"token_logprobs", logprobs},
          {"top_logprobs", tops},
          {"text_offset", offsets}};
}

}  // namespace ninfer
