// Logprobs in OpenAI's response shapes, from the engine's per-token TokenLogprob
// (sampling.h: the model's raw distribution, before penalties, bias, constraints and
// temperature, as vLLM returns by default). A token's text is its decoded piece (a piece
// that is part of a UTF-8 character decodes to U+FFFD; `bytes` then has its raw bytes).
#pragma once

#include <cstddef>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/sampling.h"
#include "text/tokenizer.h"

namespace ninfer {

// Chat: {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}],
// "refusal": null}.
// `as_ids` (vLLM's return_tokens_as_token_ids): every token written "token_id:ID", so that
// tokens whose text is not unique or not valid UTF-8 are told apart.
nlohmann::json chat_logprobs_json(const Tokenizer& tok, const std::vector<TokenLogprob>& lps,
                                  bool as_ids = false);

// Completions: {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}; the
// top dicts hold the requested alternatives plus the sampled token (OpenAI: up to
// logprobs + 1 entries). `offset` is the characters of the choice's text before these
// tokens, advanced past them (streamed chunks continue it).
nlohmann::json completion_logprobs_json(const Tokenizer& tok, const std::vector<TokenLogprob>& lps,
                                        size_t& offset, bool as_ids = false);

}  // namespace ninfer
