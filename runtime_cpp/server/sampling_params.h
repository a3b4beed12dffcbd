// The sampling side of an OpenAI request: parsing and validating every parameter that
// changes how tokens are drawn (temperature, top_p, top_k, min_p, the penalties,
// logit_bias, seed, n / best_of, logprobs, min_tokens, stop_token_ids), refusing with a
// 400 naming it every request parameter that ninfer does not honour (never accepting and
// ignoring one), and the checkpoint's generation_config.json defaults (vLLM's
// `--generation-config auto`) for the fields a request leaves out.
#pragma once

#include <optional>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

namespace ninfer {

struct CompletionRequest;

// Defaults from the checkpoint's generation_config.json, as the compiler stored them in
// the manifest's "generation_config" (only what vLLM takes: temperature, top_p, top_k,
// min_p, repetition_penalty, max_new_tokens -> max_tokens).
struct GenerationDefaults {
  std::optional<double> temperature, top_p, min_p, repetition_penalty;
  std::optional<int> top_k, max_tokens;
  // `manifest_value`: the manifest's "generation_config" (absent or null: none). Throws
  // std::invalid_argument for a value out of the range a request may give.
  static GenerationDefaults from_manifest(const nlohmann::json& manifest_value);
  bool empty() const;
  std::string describe() const;  // "temperature=0.6 top_p=0.95 ..." for the start-up line
};

// Called by parse_completion_request: fills r's sampling fields from `body` (already a
// JSON object) and refuses unknown or unsupported parameters. Throws ApiError(400).
void parse_sampling_params(const nlohmann::json& body, bool chat, int vocab_size,
                           CompletionRequest& r);

// Sets each field the request left out (r.given) to its default.
void apply_generation_defaults(CompletionRequest& r, const GenerationDefaults& d);

}  // namespace ninfer
