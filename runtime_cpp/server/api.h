// OpenAI-compatible request parsing and response building. JSON lives only in server/
// (the HTTP threads); the engine sees native types.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "server/chat_output.h"
#include "structured/grammar.h"

namespace ninfer {

// Any failure a client should see: becomes {"error": {...}} with `status`.
struct ApiError : std::runtime_error {
  ApiError(int status, std::string message, std::string type = "invalid_request_error",
           std::string param = "", std::string code = "")
      : std::runtime_error(message), status(status), type(std::move(type)), param(std::move(param)),
        code(std::move(code)) {}
  int status;
  std::string type, param, code;
};

nlohmann::json error_body(const ApiError& e);

struct CompletionRequest {
  bool chat = false;
  std::string model;
  // chat (server/chat_prompt.cpp): messages as the client sent them (keys in order),
  // normalized as vLLM does: developer -> system, text parts joined with "\n", tool call
  // arguments given as a JSON string parsed to an object.
  nlohmann::ordered_json messages;
  nlohmann::ordered_json tools;                 // null: not given
  nlohmann::ordered_json tool_choice;           // null: not given (the template never sees it)
  nlohmann::ordered_json chat_template_kwargs;  // null or an object, merged into the context
  bool add_generation_prompt = true;            // vLLM extensions
  bool continue_final_message = false;
  std::string prompt;                              // completions, text prompt
  std::optional<std::vector<int32_t>> prompt_ids;  // completions, token prompt
  int max_tokens = -1;                             // -1: until the context is full
  SamplingParams sampling;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;
  bool return_token_ids = false;  // vLLM extension: prompt_token_ids / token_ids
  // vLLM extension: logprobs' tokens as "token_id:ID" (needs logprobs)
  bool return_tokens_as_token_ids = false;
  bool ignore_eos = false;  // vLLM extension
  bool echo = false;
  // Sampling (server/sampling_params.cpp).
  int n = 1;                            // choices
  int logprobs = -1;                    // >= 0: logprobs with this many top alternatives
  int min_tokens = 0;                   // vLLM extension
  std::vector<int32_t> stop_token_ids;  // vLLM extension
  std::set<std::string> given;          // generation_config fields the request set (not defaulted)
  OutputRequest output;  // chat: reasoning and tool-call settings (server/chat_output.h)
  // Structured output (server/structured_output.cpp): the grammar the output must follow,
  // and the request field it came from (for errors).
  std::optional<GrammarSpec> grammar;
  std::string grammar_param;
};

// Parses and validates a request body; throws ApiError (400/404) naming the field.
// `served_models`: the names a request may ask for (--served-model-name); responses carry
// the first.
CompletionRequest parse_completion_request(const std::string& body, bool chat,
                                           const std::vector<std::string>& served_models,
                                           int vocab_size);
CompletionRequest parse_completion_request(const nlohmann::json& body, bool chat,
                                           const std::vector<std::string>& served_models,
                                           int vocab_size, const std::string* body_text = nullptr);
// The served name a body's `model` asks for (the first name when it names none); 404
// model_not_found for a name this server does not serve.
std::string requested_model(const nlohmann::json& body,
                            const std::vector<std::string>& served_models);
// The body of a request as a JSON object; 400 if it is not one.
nlohmann::json parse_body(const std::string& body);

struct ResponseContext {
  std::string id;
  int64_t created = 0;
  std::string model;
  bool chat = false;
};

std::string new_request_id(bool chat);
nlohmann::json usage_json(const Timings& t);
nlohmann::json timings_json(const Timings& t);
// Full (non-streaming) response.
nlohmann::json completion_response(const ResponseContext& ctx, const std::string& text,
                                   const std::string& finish_reason, const Timings& t,
                                   const std::vector<int32_t>* prompt_ids,
                                   const std::vector<int32_t>* token_ids);
// One streaming chunk; `finish_reason` empty for a delta.
nlohmann::json stream_chunk(const ResponseContext& ctx, const std::string& text, bool first,
                            const std::string& finish_reason,
                            const std::vector<int32_t>* token_ids);

}  // namespace ninfer
