// The HTTP handlers of ninfer-server (main.cpp holds the route table that binds them to
// paths) and the one error wrapper that turns any failure into an OpenAI-style error
// body. JSON lives here and in api.h only; the engine sees native types.
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

#include <exception>
#include <functional>
#include <string>

#include <httplib.h>

#include "engine/engine.h"
#include "observe/metrics.h"
#include "server/api.h"
#include "server/chat_prompt.h"
#include "text/tokenizer.h"

namespace ninfer {

using HttpHandler = std::function<void(const httplib::Request&, httplib::Response&)>;

// Wraps a handler: an ApiError becomes its status and error body, any other exception a
// 500 with the exception's message.
httplib::Server::Handler guarded(HttpHandler fn);

// What the handlers serve; must outlive the HTTP server.
struct Routes {
  Engine& engine;
  const Tokenizer& tokenizer;
  const ChatPrompt& chat;
  Metrics& metrics;
  std::string model_id;

  void health(const httplib::Request& req, httplib::Response& res) const;
  void metrics_text(const httplib::Request& req, httplib::Response& res) const;  // Prometheus
  void models(const httplib::Request& req, httplib::Response& res) const;
  void chat_completions(const httplib::Request& req, httplib::Response& res) const;
  void completions(const httplib::Request& req, httplib::Response& res) const;
  // httplib's error handler: an empty 404 (no route) gets an error body.
  void not_found(const httplib::Request& req, httplib::Response& res) const;
  // httplib's exception handler, for what escapes guarded().
  void internal_error(const httplib::Request& req, httplib::Response& res,
                      std::exception_ptr ep) const;

 private:
  // /v1/completions and /v1/chat/completions: one request through the engine, answered
  // at once or streamed as server-sent events.
  void generate(const httplib::Request& req, httplib::Response& res, bool is_chat) const;
  std::vector<int32_t> prompt_tokens(const CompletionRequest& r) const;
  std::shared_ptr<RequestState> submit(GenerationRequest g, httplib::Response& res,
                                       bool is_chat) const;
};

}  // namespace ninfer
