#include "server/sampling_params.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>

#include "engine/engine.h"
#include "server/api.h"

namespace ninfer {

using nlohmann::json;

namespace {

[[noreturn]] void bad(const std::string& param, const std::string& msg) {
  throw ApiError(400, msg, "invalid_request_error", param);
}

bool given(const json& body, const char* key) { return body.contains(key) && !body[key].is_null(); }

std::string num(double x) {
  std::ostringstream s;
  s << x;
  return s.str();
}

double number(const json& body, const char* key, double lo, double hi, double dflt) {
  if (!given(body, key)) return dflt;
  const json& v = body[key];
  if (!v.is_number()) bad(key, std::string("'") + key + "' must be a number, got " + v.type_name());
  const double x = v.get<double>();
  if (!(x >= lo && x <= hi))
    bad(key, std::string("'") + key + "' must be between " + num(lo) + " and " + num(hi) +
                 ", got " + num(x));
  return x;
}

int64_t integer(const json& body, const char* key, int64_t lo, int64_t hi, int64_t dflt) {
  if (!given(body, key)) return dflt;
  const json& v = body[key];
  if (!v.is_number_integer())
    bad(key, std::string("'") + key + "' must be an integer, got " + v.type_name());
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    bad(key, std::string("'") + key + "' is out of range");
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi)
    bad(key, std::string("'") + key + "' must be in [" + std::to_string(lo) + ", " +
                 std::to_string(hi) + "], got " + std::to_string(x));
  return x;
}

// How ninfer treats each request parameter besides those api.cpp parses itself.
enum class Kind {
  kNoOp,       // metadata that cannot change the output: validated, then unused
  kRefused,    // changes the output in a way ninfer does not implement: 400 unless null
  kElsewhere,  // parsed by another part of the server (structured output, tools, templates)
};

struct Policy {
  Kind kind;
  const char* why;  // kRefused: the message's reason
  bool chat, completions;
};

const std::map<std::string, Policy>& policies() {
  static const std::map<std::string, Policy> p = {
      // Metadata (OpenAI): stored, billed or routed by OpenAI; nothing of it reaches the
      // tokens.
      {"user", {Kind::kNoOp, "", true, true}},
      {"metadata", {Kind::kNoOp, "", true, false}},
      {"store", {Kind::kNoOp, "", true, false}},
      {"service_tier", {Kind::kNoOp, "", true, false}},
      {"safety_identifier", {Kind::kNoOp, "", true, false}},
      {"prompt_cache_key", {Kind::kNoOp, "", true, false}},
      {"prompt_cache_retention", {Kind::kNoOp, "", true, false}},
      {"prompt_cache_options", {Kind::kNoOp, "", true, false}},
      // Not implemented: refused.
      {"audio", {Kind::kRefused, "audio output is not supported", true, false}},
      {"prediction", {Kind::kRefused, "predicted outputs are not supported", true, false}},
      {"web_search_options", {Kind::kRefused, "web search is not supported", true, false}},
      {"functions",
       {Kind::kRefused, "the deprecated 'functions' is not supported; use 'tools'", true, false}},
      {"function_call",
       {Kind::kRefused, "the deprecated 'function_call' is not supported; use 'tool_choice'", true,
        false}},
      {"parallel_tool_calls", {Kind::kElsewhere, "", true, false}},
      {"include_reasoning", {Kind::kElsewhere, "", true, false}},
      {"thinking_budget", {Kind::kElsewhere, "", true, false}},
      {"thinking_token_budget", {Kind::kElsewhere, "", true, false}},
      {"verbosity", {Kind::kRefused, "'verbosity' is not supported", true, false}},
      {"moderation", {Kind::kRefused, "moderation is not supported", true, false}},
      {"suffix", {Kind::kRefused, "'suffix' (insertion) is not supported", false, true}},
      // Parsed by the parts of the server that implement them (issue 13: structured
      // output, tool calls, chat templates, reasoning); the lead's merge replaces these.
      {"tools", {Kind::kElsewhere, "", true, false}},
      {"tool_choice", {Kind::kElsewhere, "", true, false}},
      {"response_format", {Kind::kElsewhere, "", true, true}},
      {"reasoning_effort", {Kind::kElsewhere, "", true, false}},
      {"chat_template_kwargs", {Kind::kElsewhere, "", true, false}},
      {"add_generation_prompt", {Kind::kElsewhere, "", true, false}},
      {"continue_final_message", {Kind::kElsewhere, "", true, false}},
      {"structured_outputs", {Kind::kElsewhere, "", true, true}},
      {"guided_json", {Kind::kElsewhere, "", true, true}},
      {"guided_regex", {Kind::kElsewhere, "", true, true}},
      {"guided_choice", {Kind::kElsewhere, "", true, true}},
      {"guided_grammar", {Kind::kElsewhere, "", true, true}},
      {"guided_whitespace_pattern", {Kind::kElsewhere, "", true, true}},
      {"guided_decoding_backend", {Kind::kElsewhere, "", true, true}},
  };
  return p;
}

// Parsed here or in api.cpp (parse_completion_request).
bool handled(const std::string& key, bool chat) {
  static const char* const both[] = {"model",
                                     "max_tokens",
                                     "max_completion_tokens",
                                     "stop",
                                     "stream",
                                     "stream_options",
                                     "return_token_ids",
                                     "return_tokens_as_token_ids",
                                     "ignore_eos",
                                     "temperature",
                                     "top_p",
                                     "top_k",
                                     "min_p",
                                     "presence_penalty",
                                     "frequency_penalty",
                                     "repetition_penalty",
                                     "logit_bias",
                                     "seed",
                                     "n",
                                     "logprobs",
                                     "min_tokens",
                                     "stop_token_ids"};
  for (const char* k : both)
    if (key == k) return true;
  if (chat) return key == "messages" || key == "top_logprobs" || key == "modalities";
  return key == "prompt" || key == "echo" || key == "best_of";
}

void check_parameters(const json& body, bool chat) {
  for (const auto& [key, value] : body.items()) {
    if (handled(key, chat)) continue;
    auto it = policies().find(key);
    if (it == policies().end() || !(chat ? it->second.chat : it->second.completions))
      bad(key, "Unrecognized request argument supplied: " + key);
    const Policy& p = it->second;
    if (p.kind == Kind::kRefused && !value.is_null()) bad(key, p.why);
    if (p.kind == Kind::kNoOp && key == "user" && !value.is_null() && !value.is_string())
      bad(key, "'user' must be a string");
    if (p.kind == Kind::kNoOp && key == "metadata" && !value.is_null() && !value.is_object())
      bad(key, "'metadata' must be an object");
    if (p.kind == Kind::kNoOp && key == "store" && !value.is_null() && !value.is_boolean())
      bad(key, "'store' must be a boolean");
  }
  if (chat && given(body, "modalities")) {
    const json& m = body["modalities"];
    if (!m.is_array()) bad("modalities", "'modalities' must be an array");
    for (const json& x : m)
      if (x != "text") bad("modalities", "only the 'text' modality is supported");
  }
  if (given(body, "stream_options") && body["stream_options"].is_object()) {
    for (const auto& [key, value] : body["stream_options"].items()) {
      if (key == "include_usage") continue;
      if (key == "include_obfuscation" && (value.is_null() || value == false)) continue;
      bad("stream_options", "stream_options." + key + " is not supported");
    }
  }
}

}  // namespace

void parse_sampling_params(const json& body, bool chat, int vocab_size, CompletionRequest& r) {
  check_parameters(body, chat);
  for (const char* key : {"temperature", "top_p", "top_k", "min_p", "repetition_penalty"})
    if (given(body, key)) r.given.insert(key);
  if (given(body, "max_tokens") || given(body, "max_completion_tokens"))
    r.given.insert("max_tokens");

  SamplingParams& s = r.sampling;
  s.temperature = static_cast<float>(number(body, "temperature", 0, 2, 1.0));
  s.top_p = static_cast<float>(number(body, "top_p", 0, 1, 1.0));
  if (given(body, "top_p") && s.top_p <= 0) bad("top_p", "'top_p' must be > 0");
  const int64_t top_k = integer(body, "top_k", -1, 1 << 30, 0);
  s.top_k = top_k < 0 ? 0 : static_cast<int>(top_k);  // -1 and 0: off
  s.min_p = static_cast<float>(number(body, "min_p", 0, 1, 0.0));
  s.presence_penalty = static_cast<float>(number(body, "presence_penalty", -2, 2, 0.0));
  s.frequency_penalty = static_cast<float>(number(body, "frequency_penalty", -2, 2, 0.0));
  s.repetition_penalty = static_cast<float>(number(body, "repetition_penalty", 0, 1e9, 1.0));
  if (given(body, "repetition_penalty") && s.repetition_penalty <= 0)
    bad("repetition_penalty", "'repetition_penalty' must be > 0");
  if (given(body, "logit_bias")) {
    const json& b = body["logit_bias"];
    if (!b.is_object())
      bad("logit_bias", "'logit_bias' must be an object of token id strings to numbers");
    for (const auto& [key, value] : b.items()) {
      char* end = nullptr;
      const long id = std::strtol(key.c_str(), &end, 10);
      if (key.empty() || *end || id < 0 || id >= vocab_size)
        bad("logit_bias", "logit_bias: '" + key + "' is not a token id in [0, " +
                              std::to_string(vocab_size) + ")");
      if (!value.is_number() || !(value.get<double>() >= -100 && value.get<double>() <= 100))
        bad("logit_bias", "logit_bias['" + key + "'] must be a number in [-100, 100]");
      s.logit_bias.emplace_back(static_cast<int32_t>(id), value.get<float>());
    }
  }
  if (given(body, "seed"))
    r.seed = static_cast<uint64_t>(integer(body, "seed", INT64_MIN, INT64_MAX, 0));
  r.n = static_cast<int>(integer(body, "n", 1, 1 << 20, 1));
  if (!chat && given(body, "best_of") && integer(body, "best_of", 1, 1 << 20, 1) != r.n)
    bad("best_of",
        "'best_of' must equal n (every candidate is returned); ranking more candidates than n "
        "is not supported");
  if (chat) {
    const bool want = given(body, "logprobs") && [&] {
      if (!body["logprobs"].is_boolean()) bad("logprobs", "'logprobs' must be a boolean");
      return body["logprobs"].get<bool>();
    }();
    const int top = static_cast<int>(integer(body, "top_logprobs", 0, Engine::kMaxLogprobs, 0));
    if (given(body, "top_logprobs") && !want)
      bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    r.logprobs = want ? top : -1;
  } else {
    if (given(body, "logprobs") && !body["logprobs"].is_number_integer())
      bad("logprobs", "'logprobs' must be an integer (how many top alternatives)");
    r.logprobs = static_cast<int>(integer(body, "logprobs", 0, Engine::kMaxLogprobs, -1));
  }
  r.min_tokens = static_cast<int>(integer(body, "min_tokens", 0, 1 << 30, 0));
  if (r.max_tokens >= 0 && r.min_tokens > r.max_tokens)
    bad("min_tokens", "'min_tokens' (" + std::to_string(r.min_tokens) +
                          ") must be at most max_tokens (" + std::to_string(r.max_tokens) + ")");
  if (given(body, "stop_token_ids")) {
    const json& ids = body["stop_token_ids"];
    if (!ids.is_array()) bad("stop_token_ids", "'stop_token_ids' must be an array of token ids");
    for (const json& v : ids) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= vocab_size)
        bad("stop_token_ids",
            "stop_token_ids entries must be integers in [0, " + std::to_string(vocab_size) + ")");
      r.stop_token_ids.push_back(v.get<int32_t>());
    }
  }
}

void apply_generation_defaults(CompletionRequest& r, const GenerationDefaults& d) {
  auto left_out = [&](const char* key) { return r.given.count(key) == 0; };
  if (d.temperature && left_out("temperature"))
    r.sampling.temperature = static_cast<float>(*d.temperature);
  if (d.top_p && left_out("top_p")) r.sampling.top_p = static_cast<float>(*d.top_p);
  if (d.top_k && left_out("top_k")) r.sampling.top_k = *d.top_k < 0 ? 0 : *d.top_k;
  if (d.min_p && left_out("min_p")) r.sampling.min_p = static_cast<float>(*d.min_p);
  if (d.repetition_penalty && left_out("repetition_penalty"))
    r.sampling.repetition_penalty = static_cast<float>(*d.repetition_penalty);
}

GenerationDefaults GenerationDefaults::from_manifest(const json& g) {
  GenerationDefaults d;
  if (g.is_null()) return d;
  if (!g.is_object()) throw std::invalid_argument("manifest generation_config must be an object");
  auto get = [&](const char* key, double lo, double hi, bool open_lo) -> std::optional<double> {
    if (!g.contains(key) || g[key].is_null()) return std::nullopt;
    if (!g[key].is_number())
      throw std::invalid_argument(std::string("generation_config ") + key + " is not a number");
    const double x = g[key].get<double>();
    if (!(x >= lo && x <= hi) || (open_lo && x <= lo))
      throw std::invalid_argument(std::string("generation_config ") + key + " = " + num(x) +
                                  " is out of range");
    return x;
  };
  d.temperature = get("temperature", 0, 2, false);
  d.top_p = get("top_p", 0, 1, true);
  d.min_p = get("min_p", 0, 1, false);
  d.repetition_penalty = get("repetition_penalty", 0, 1e9, true);
  if (auto k = get("top_k", -1, 1 << 30, false)) d.top_k = static_cast<int>(*k);
  if (auto m = get("max_tokens", 1, 1 << 30, false)) d.max_tokens = static_cast<int>(*m);
  return d;
}

bool GenerationDefaults::empty() const {
  return !temperature && !top_p && !min_p && !repetition_penalty && !top_k && !max_tokens;
}

std::string GenerationDefaults::describe() const {
  std::string out;
  auto add = [&](const char* k, const std::string& v) {
    out += (out.empty() ? "" : " ") + (k + ("=" + v));
  };
  if (temperature) add("temperature", num(*temperature));
  if (top_p) add("top_p", num(*top_p));
  if (top_k) add("top_k", std::to_string(*top_k));
  if (min_p) add("min_p", num(*min_p));
  if (repetition_penalty) add("repetition_penalty", num(*repetition_penalty));
  if (max_tokens) add("max_tokens", std::to_string(*max_tokens));
  return out;
}

}  // namespace ninfer
