// The Anthropic Messages API (POST /v1/messages, /v1/messages/count_tokens) as a
// translation onto the OpenAI chat path: a Messages request becomes a chat-completions
// body that goes through the same parsing, chat template and generation as
// /v1/chat/completions, and the OpenAI-shaped result (the full response, or its stream
// chunks) is translated back into an Anthropic message or Anthropic's event stream.
// Only nlohmann::json in and out, so the translation is testable without a server.
//
// Request: `system` (string or text blocks) -> a system message; message content as a
// string or blocks: text, tool_use (assistant: -> tool_calls, input as a JSON string),
// tool_result (user: -> role "tool" messages with tool_call_id, before the user's text),
// thinking (assistant: -> reasoning_content); consecutive turns of one role are one turn,
// as Anthropic combines them. `tools` -> OpenAI function tools, `tool_choice`
// auto|any|tool|none -> auto|required|{function}|none, `stop_sequences` -> stop,
// `thinking` enabled|adaptive|disabled -> chat_template_kwargs.enable_thinking (+
// thinking_budget), `output_config.format` -> response_format json_schema. Fields that do
// not change the output (metadata, service_tier, cache_control, ...) are accepted; every
// other one, images, documents and a final assistant message (prefill) get 400.
//
// Response: content [thinking?, text?, tool_use...], stop_reason end_turn | max_tokens |
// stop_sequence (with stop_sequence) | tool_use, usage {input_tokens, output_tokens}.
// Errors: {"type": "error", "error": {"type", "message"}}.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/api.h"

namespace ninfer::anthropic {

// The chat-completions body for a Messages request, in the body's key order (as the
// OpenAI path reads tools and schemas); throws ApiError (400) naming the field.
// `count_tokens`: the body of /v1/messages/count_tokens (no max_tokens, no sampling).
nlohmann::ordered_json to_openai_request(const nlohmann::ordered_json& body,
                                         bool count_tokens = false);

// A non-streaming chat.completion -> an Anthropic message with id `id`.
nlohmann::json from_openai_response(const nlohmann::json& completion, const std::string& id);

// Anthropic's error body for an ApiError (the type follows the status).
nlohmann::json error_body(const ApiError& e);

std::string new_message_id();

// One server-sent event: `event: <name>` and `data: <json>`.
struct Event {
  std::string name;
  nlohmann::json data;
  std::string sse() const;
};

// Translates a chat.completion.chunk stream (choice 0; with the usage chunk of
// stream_options.include_usage) into Anthropic's events: message_start and ping first,
// then per block content_block_start, content_block_delta (text_delta, thinking_delta,
// input_json_delta) and content_block_stop, then message_delta {stop_reason,
// stop_sequence, usage} and message_stop. An error chunk ({"error": ...}) becomes an
// `error` event and ends the stream.
class StreamTranslator {
 public:
  StreamTranslator(std::string id, std::string model, int input_tokens);
  std::vector<Event> start();
  std::vector<Event> feed(const nlohmann::json& chunk);
  std::vector<Event> finish();  // after the last chunk (nothing if an error ended it)

 private:
  enum class Block { kNone, kText, kThinking, kToolUse };
  void open(Block kind, nlohmann::json content_block, std::vector<Event>& out);
  void close(std::vector<Event>& out);
  void delta(nlohmann::json d, std::vector<Event>& out);

  std::string id_, model_;
  int input_tokens_, output_tokens_ = 0;
  int cached_tokens_ = 0;  // of input_tokens_, read from the prefix cache (the usage chunk)
  int index_ = -1;         // the open block's index; -1 before the first
  Block open_ = Block::kNone;
  int open_tool_ = -1;  // the OpenAI tool-call index of the open tool_use block
  std::string finish_reason_, stop_sequence_;
  bool errored_ = false;
};

}  // namespace ninfer::anthropic
