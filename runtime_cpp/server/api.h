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
#include "text/chat_format.h"

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
  std::vector<ChatMessage> messages;               // chat
  std::string prompt;                              // completions, text prompt
  std::optional<std::vector<int32_t>> prompt_ids;  // completions, token prompt
  int max_tokens = -1;                             // -1: until the context is full
  SamplingParams sampling;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;
  bool return_token_ids = false;  // vLLM extension: prompt_token_ids / token_ids
  bool ignore_eos = false;        // vLLM extension
  bool echo = false;
  // Sampling (server/sampling_params.cpp).
  int n = 1;                            // choices
  int logprobs = -1;                    // >= 0: logprobs with this many top alternatives
  int min_tokens = 0;                   // vLLM extension
  std::vector<int32_t> stop_token_ids;  // vLLM extension
  std::set<std::string> given;          // generation_config fields the request set (not defaulted)
  nlohmann::json tools;                 // chat: null or the array
  nlohmann::json tool_choice;           // chat: null, a string or object
  nlohmann::json chat_template_kwargs = nlohmann::json::object();  // chat
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
