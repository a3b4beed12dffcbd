#include "server/api.h"

#include <algorithm>

#include "server/chat_prompt.h"
#include "server/random_id.h"
#include "server/sampling_params.h"
#include "server/structured_output.h"

namespace ninfer {

using nlohmann::json;

json error_body(const ApiError& e) {
  json err = {{"message", e.what()}, {"type", e.type}};
  err["param"] = e.param.empty() ? json(nullptr) : json(e.param);
  err["code"] = e.code.empty() ? json(nullptr) : json(e.code);
  return json{{"error", err}};
}

namespace {

[[noreturn]] void bad(const std::string& param, const std::string& msg) {
  throw ApiError(400, msg, "invalid_request_error", param);
}

const char* type_name(const json& v) { return v.type_name(); }

int64_t get_int(const json& body, const char* key, int64_t lo, int64_t hi, int64_t dflt) {
  if (!body.contains(key) || body[key].is_null()) return dflt;
  const json& v = body[key];
  if (!v.is_number_integer())
    bad(key, std::string("'") + key + "' must be an integer, got " + type_name(v));
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi)
    bad(key, std::string("'") + key + "' must be in [" + std::to_string(lo) + ", " +
                 std::to_string(hi) + "], got " + std::to_string(x));
  return x;
}

bool get_bool(const json& body, const char* key, bool dflt) {
  if (!body.contains(key) || body[key].is_null()) return dflt;
  if (!body[key].is_boolean())
    bad(key, std::string("'") + key + "' must be a boolean, got " + type_name(body[key]));
  return body[key].get<bool>();
}

}  // namespace

json parse_body(const std::string& body_text) {
  json body;
  try {
    body = json::parse(body_text);
  } catch (const json::parse_error& e) {
    throw ApiError(400, std::string("request body is not valid JSON: ") + e.what());
  }
  if (!body.is_object()) bad("", "request body must be a JSON object");
  return body;
}

std::string requested_model(const json& body, const std::vector<std::string>& served) {
  if (!body.contains("model") || body["model"].is_null()) return served.at(0);
  if (!body["model"].is_string()) bad("model", "'model' must be a string");
  const std::string model = body["model"].get<std::string>();
  if (model.empty() || std::find(served.begin(), served.end(), model) != served.end())
    return served.at(0);
  std::string names;
  for (const auto& n : served) names += (names.empty() ? "'" : ", '") + n + "'";
  throw ApiError(404, "The model '" + model + "' does not exist; this server serves " + names,
                 "invalid_request_error", "model", "model_not_found");
}

CompletionRequest parse_completion_request(const std::string& body_text, bool chat,
                                           const std::vector<std::string>& served_models,
                                           int vocab_size) {
  return parse_completion_request(parse_body(body_text), chat, served_models, vocab_size,
                                  &body_text);
}

CompletionRequest parse_completion_request(const json& body, bool chat,
                                           const std::vector<std::string>& served_models,
                                           int vocab_size, const std::string* body_text) {
  if (!body.is_object()) bad("", "request body must be a JSON object");
  CompletionRequest r;
  r.chat = chat;
  r.model = requested_model(body, served_models);

  if (chat) {
    // Messages, tools, tool_choice, chat_template_kwargs in the client's key order.
    parse_chat_fields(body_text ? *body_text : body.dump(), r);
    parse_output_request(body, r);
  } else {
    if (!body.contains("prompt")) bad("prompt", "'prompt' is required");
    const json& p = body["prompt"];
    if (p.is_string()) {
      r.prompt = p.get<std::string>();
    } else if (p.is_array() && p.size() == 1 && p[0].is_string()) {
      r.prompt = p[0].get<std::string>();
    } else if (p.is_array() && !p.empty() && p[0].is_number_integer()) {
      std::vector<int32_t> ids;
      for (const auto& v : p) {
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= vocab_size)
          bad("prompt",
              "token prompt entries must be integers in [0, " + std::to_string(vocab_size) + ")");
        ids.push_back(v.get<int32_t>());
      }
      r.prompt_ids = std::move(ids);
    } else {
      bad("prompt",
          "'prompt' must be a string, a one-element array of strings, or an array "
          "of token ids");
    }
    r.echo = get_bool(body, "echo", false);
    if (r.echo) bad("echo", "'echo' is not supported");
  }

  int64_t max_tokens = get_int(body, "max_tokens", 1, 1 << 30, -1);
  max_tokens = get_int(body, "max_completion_tokens", 1, 1 << 30, max_tokens);
  r.max_tokens = static_cast<int>(max_tokens);
  if (body.contains("stop") && !body["stop"].is_null()) {
    const json& s = body["stop"];
    if (s.is_string()) {
      r.stop.push_back(s.get<std::string>());
    } else if (s.is_array() && s.size() <= 4) {
      for (const auto& x : s) {
        if (!x.is_string()) bad("stop", "'stop' entries must be strings");
        r.stop.push_back(x.get<std::string>());
      }
    } else {
      bad("stop", "'stop' must be a string or an array of at most 4 strings");
    }
  }
  r.stream = get_bool(body, "stream", false);
  if (body.contains("stream_options") && !body["stream_options"].is_null()) {
    if (!body["stream_options"].is_object())
      bad("stream_options", "'stream_options' must be an object");
    r.include_usage = get_bool(body["stream_options"], "include_usage", false);
  }
  r.return_token_ids = get_bool(body, "return_token_ids", false);
  r.return_tokens_as_token_ids = get_bool(body, "return_tokens_as_token_ids", false);
  r.ignore_eos = get_bool(body, "ignore_eos", false);
  parse_sampling_params(body, chat, vocab_size, r);
  if (r.return_tokens_as_token_ids && r.logprobs < 0)
    bad("return_tokens_as_token_ids", "'return_tokens_as_token_ids' needs logprobs");
  // A schema keeps the key order of the text it came in (a translated body: sorted).
  parse_structured_output(body, body_text ? *body_text : body.dump(), r);
  return r;
}

std::string new_request_id(bool chat) {
  return random_id(chat ? "chatcmpl-" : "cmpl-", kIdHexDigits);
}

json usage_json(const Timings& t) {
  return {{"prompt_tokens", t.prompt_n},
          {"completion_tokens", t.predicted_n},
          {"total_tokens", t.prompt_n + t.predicted_n},
          {"prompt_tokens_details", {{"cached_tokens", t.cache_n}}}};
}

json timings_json(const Timings& t) {
  auto per_s = [](int n, double ms) { return ms > 0 ? 1000.0 * n / ms : 0.0; };
  json j = {{"queue_ms", t.queue_ms},
            {"prompt_n", t.prompt_n},
            {"cache_n", t.cache_n},
            {"prompt_ms", t.prompt_ms},
            {"prompt_per_second", per_s(t.prompt_n, t.prompt_ms)},
            {"predicted_n", t.predicted_n},
            {"predicted_ms", t.predicted_ms},
            {"predicted_per_second", per_s(t.predicted_n, t.predicted_ms)}};
  if (t.draft_n >= 0) {  // speculative decoding: what was proposed and accepted
    j["draft_n"] = t.draft_n;
    j["draft_accepted_n"] = t.draft_accepted_n;
  }
  return j;
}

json completion_response(const ResponseContext& ctx, const std::string& text,
                         const std::string& finish_reason, const Timings& t,
                         const std::vector<int32_t>* prompt_ids,
                         const std::vector<int32_t>* token_ids) {
  json choice = {{"index", 0}, {"finish_reason", finish_reason}, {"logprobs", nullptr}};
  if (ctx.chat) choice["message"] = {{"role", "assistant"}, {"content", text}};
  else choice["text"] = text;
  if (token_ids) choice["token_ids"] = *token_ids;
  json out = {{"id", ctx.id},
              {"object", ctx.chat ? "chat.completion" : "text_completion"},
              {"created", ctx.created},
              {"model", ctx.model},
              {"choices", json::array({choice})},
              {"usage", usage_json(t)},
              {"timings", timings_json(t)}};
  if (prompt_ids) out["prompt_token_ids"] = *prompt_ids;
  return out;
}

json stream_chunk(const ResponseContext& ctx, const std::string& text, bool first,
                  const std::string& finish_reason, const std::vector<int32_t>* token_ids) {
  json choice = {{"index", 0}, {"logprobs", nullptr}};
  choice["finish_reason"] = finish_reason.empty() ? json(nullptr) : json(finish_reason);
  if (ctx.chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || finish_reason.empty()) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  if (token_ids) choice["token_ids"] = *token_ids;
  return {{"id", ctx.id},
          {"object", ctx.chat ? "chat.completion.chunk" : "text_completion"},
          {"created", ctx.created},
          {"model", ctx.model},
          {"choices", json::array({choice})}};
}

}  // namespace ninfer
