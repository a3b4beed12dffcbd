// The HTTP handlers of ninfer-server (main.cpp holds the route table that binds them to
// paths) and the one error wrapper that turns any failure into an OpenAI-style error
// body (Anthropic-style on the Anthropic routes). JSON lives in server/ only; the engine
// sees native types.
//
// Overload and failure statuses: a request that can never fit (context or KV pool) is
// refused at once with 400; when --max-pending-requests requests already wait, 429 with
// Retry-After (type rate_limit_error, code queue_full: "come back later", which OpenAI
// clients retry); a request not admitted within --pending-timeout-ms gets 503 with
// Retry-After (type server_error, code pending_timeout: the server, not the client's
// rate, is the problem; clients retry 503 too). Streaming responses send their headers
// only once the request is admitted, so these statuses reach streaming clients as well.
// A client that disconnects (a failed write, or the socket found closed while waiting)
// has its request cancelled; the engine frees its slot and blocks within one step.
#pragma once

#include <atomic>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "observe/metrics.h"
#include "server/api.h"
#include "server/chat_prompt.h"
#include "server/output_parser.h"
#include "server/sampling_params.h"
#include "structured/grammar.h"
#include "text/tokenizer.h"

namespace ninfer {

using HttpHandler = std::function<void(const httplib::Request&, httplib::Response&)>;

// The error bodies a route answers with: OpenAI's {"error": {...}} or, on the Anthropic
// routes, {"type": "error", "error": {...}}.
enum class ErrorShape { kOpenAI, kAnthropic };

// Wraps a handler: an ApiError becomes its status and error body, any other exception a
// 500 with the exception's message.
// Sends `body` as the JSON response with `status` (invalid UTF-8 replaced).
void send_json(httplib::Response& res, int status, const nlohmann::json& body);

httplib::Server::Handler guarded(HttpHandler fn, ErrorShape shape = ErrorShape::kOpenAI);

// httplib's error handler: an empty 404 (no route) gets an error body.
void not_found(const httplib::Request& req, httplib::Response& res);
// httplib's exception handler, for what escapes guarded().
void internal_error(const httplib::Request& req, httplib::Response& res, std::exception_ptr ep);

// Where a generation's OpenAI-shaped output goes: the OpenAI routes write it as JSON or
// server-sent events, /v1/messages translates it to Anthropic's shapes first.
struct GenerationSink {
  // Not streaming: the whole chat.completion / text_completion object.
  std::function<void(httplib::Response&, const nlohmann::json& response)> response;
  // Streaming, once admitted, before the first chunk (optional); false: the write failed.
  std::function<bool(httplib::DataSink&, int prompt_tokens)> begin;
  // Streaming: each chunk, then the usage chunk if asked for, or an error as {"error": ...}
  // (the last chunk then); false: the write failed (the client is gone).
  std::function<bool(httplib::DataSink&, const nlohmann::json& chunk)> chunk;
  // Streaming, after the last chunk.
  std::function<void(httplib::DataSink&)> end;
};

// What the handlers serve; must outlive the HTTP server.
struct Routes {
  Engine& engine;
  const Tokenizer& tokenizer;
  const ChatPrompt& chat;
  Metrics& metrics;
  std::vector<std::string> model_names;  // --served-model-name; responses carry the first
  GenerationDefaults defaults;           // generation_config.json, for fields a request leaves out
  OutputConfig output;                   // reasoning and tool-call parsers (server/chat_output.h)
  const GrammarCompiler* grammars = nullptr;  // structured output; null: refused with 400
  // Generations being answered (streams until their last write): a stopping server
  // answers them before it closes the port.
  mutable std::atomic<int> in_flight{0};

  void health(const httplib::Request& req, httplib::Response& res) const;
  void metrics_text(const httplib::Request& req, httplib::Response& res) const;  // Prometheus
  void models(const httplib::Request& req, httplib::Response& res) const;
  void model(const httplib::Request& req, httplib::Response& res) const;  // /v1/models/{id}
  void chat_completions(const httplib::Request& req, httplib::Response& res) const;
  void completions(const httplib::Request& req, httplib::Response& res) const;
  // The Anthropic Messages API (anthropic.h), over the chat-completions path.
  void messages(const httplib::Request& req, httplib::Response& res) const;
  void count_tokens(const httplib::Request& req, httplib::Response& res) const;
  // vLLM's /tokenize ({prompt} or {messages} -> {tokens, count, max_model_len}) and
  // /detokenize ({tokens} -> {prompt}).
  void tokenize(const httplib::Request& req, httplib::Response& res) const;
  void detokenize(const httplib::Request& req, httplib::Response& res) const;

 private:
  // /v1/completions and /v1/chat/completions.
  void generate(const httplib::Request& req, httplib::Response& res, bool is_chat) const;
  // `rendered`, if given, receives the chat prompt's text (the output parsers read its tail).
  std::vector<int32_t> prompt_tokens(const CompletionRequest& r,
                                     std::string* rendered = nullptr) const;
  // One request through the engine, answered at once or streamed, into `sink`. `id`:
  // the request's id (empty: a new chatcmpl- / cmpl- id).
  void run(const httplib::Request& req, httplib::Response& res, CompletionRequest r,
           GenerationSink sink, std::string id = "") const;
  nlohmann::json model_entry(const std::string& name) const;
  // The grammar of a tool_choice that forces a call ("required", a named function) in the
  // server's tool-call format; empty otherwise. 400 when the server cannot force one.
  TokenConstraints forced_tool_call(const CompletionRequest& r, const std::string& prompt) const;
  std::shared_ptr<RequestState> submit(GenerationRequest g, httplib::Response& res,
                                       bool is_chat) const;
  nlohmann::json logprobs_json(bool chat, const std::vector<TokenLogprob>& lps, size_t& text_offset,
                               bool as_ids) const;
};

}  // namespace ninfer
