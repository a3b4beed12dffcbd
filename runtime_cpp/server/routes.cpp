#include "server/routes.h"

#include <cstdint>
#include <ctime>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/api.h"
#include "server/client_watch.h"

namespace ninfer {
namespace {

using nlohmann::json;

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

// An engine event that is an error, as the status the client should see.
ApiError event_error(const GenerationEvent& ev, httplib::Response& res) {
  if (ev.error_code == "pending_timeout") {
    res.set_header("Retry-After", "1");
    return ApiError(503, ev.error, "server_error", "", "pending_timeout");
  }
  if (ev.error_code == "shutting_down")
    return ApiError(503, ev.error, "server_error", "", "shutting_down");
  return ApiError(500, ev.error, "server_error");
}

void client_gone(httplib::Response& res) {
  // Nobody reads this; 499 is nginx's "client closed request".
  send_json(res, 499, error_body(ApiError(499, "client closed the connection", "server_error")));
}

}  // namespace

httplib::Server::Handler guarded(HttpHandler fn) {
  return [fn](const httplib::Request& req, httplib::Response& res) {
    try {
      fn(req, res);
    } catch (const ApiError& e) {
      send_json(res, e.status, error_body(e));
    } catch (const std::exception& e) {
      send_json(res, 500, error_body(ApiError(500, e.what(), "server_error")));
    }
  };
}

void Routes::health(const httplib::Request&, httplib::Response& res) const {
  send_json(res, 200, {{"status", "ok"}});
}

void Routes::metrics_text(const httplib::Request&, httplib::Response& res) const {
  res.status = 200;
  res.set_content(metrics.render(), Metrics::content_type());
}

void Routes::models(const httplib::Request&, httplib::Response& res) const {
  const ModelInfo& info = engine.info();
  send_json(res, 200,
            {{"object", "list"},
             {"data", json::array({{{"id", model_id},
                                    {"object", "model"},
                                    {"created", 0},
                                    {"owned_by", "ninfer"},
                                    {"max_model_len", engine.max_context()},
                                    {"vocab_size", info.vocab_size},
                                    {"target", info.target}}})}});
}

void Routes::chat_completions(const httplib::Request& req, httplib::Response& res) const {
  generate(req, res, true);
}

void Routes::completions(const httplib::Request& req, httplib::Response& res) const {
  generate(req, res, false);
}

void Routes::not_found(const httplib::Request& req, httplib::Response& res) const {
  if (res.status == 404 && res.body.empty())
    send_json(res, 404,
              error_body(ApiError(404, "no route " + req.method + " " + req.path,
                                  "invalid_request_error", "", "not_found")));
}

void Routes::internal_error(const httplib::Request&, httplib::Response& res,
                            std::exception_ptr ep) const {
  std::string msg = "internal error";
  try {
    if (ep) std::rethrow_exception(ep);
  } catch (const std::exception& e) {
    msg = e.what();
  }
  send_json(res, 500, error_body(ApiError(500, msg, "server_error")));
}

std::vector<int32_t> Routes::prompt_tokens(const CompletionRequest& r) const {
  if (r.prompt_ids) return *r.prompt_ids;
  if (r.chat) return tokenizer.encode(chat.render(r), /*add_special_tokens=*/false);
  return tokenizer.encode(r.prompt, /*add_special_tokens=*/true);
}

std::shared_ptr<RequestState> Routes::submit(GenerationRequest g, httplib::Response& res,
                                             bool is_chat) const {
  try {
    return engine.submit(std::move(g));
  } catch (const RequestRejected& e) {
    const std::string param = e.param == "prompt" && is_chat ? std::string("messages") : e.param;
    switch (e.reason) {
      case RequestRejected::Reason::kQueueFull:
        res.set_header("Retry-After", "1");
        throw ApiError(429, e.what(), "rate_limit_error", "", "queue_full");
      case RequestRejected::Reason::kContextLength:
        throw ApiError(400, e.what(), "invalid_request_error", param, "context_length_exceeded");
      case RequestRejected::Reason::kKvCapacity:
        throw ApiError(400, e.what(), "invalid_request_error", param, "kv_cache_capacity_exceeded");
      case RequestRejected::Reason::kShuttingDown:
        throw ApiError(503, e.what(), "server_error", "", "shutting_down");
    }
    throw;
  }
}

void Routes::generate(const httplib::Request& req, httplib::Response& res, bool is_chat) const {
  CompletionRequest r =
      parse_completion_request(req.body, is_chat, model_id, engine.info().vocab_size);
  GenerationRequest g;
  g.prompt = prompt_tokens(r);
  if (g.prompt.empty())
    throw ApiError(400, "the prompt is empty after tokenization", "invalid_request_error",
                   is_chat ? "messages" : "prompt");
  g.max_tokens = r.max_tokens;  // -1: the engine fills what the context and pool allow
  g.sampling = r.sampling;
  g.seed = r.seed ? *r.seed : std::random_device{}();
  g.stop = r.stop;
  g.ignore_eos = r.ignore_eos;
  ResponseContext ctx{new_request_id(is_chat), static_cast<int64_t>(std::time(nullptr)), r.model,
                      is_chat};
  g.id = ctx.id;
  auto state = submit(std::move(g), res, is_chat);
  state->wake_per_token = r.stream;
  auto watch = std::make_shared<ClientWatch>(req);

  // Until admitted nothing is sent, so a refusal while queued keeps its own status.
  while (!state->wait_started(kPollMs)) {
    if (watch->gone()) {
      state->cancel();
      return client_gone(res);
    }
  }
  if (!state->started()) {
    GenerationEvent ev = state->next();
    if (ev.kind == GenerationEvent::Kind::kError) throw event_error(ev, res);
    return client_gone(res);  // cancelled while queued
  }

  if (!r.stream) {
    std::string text;
    std::vector<int32_t> ids;
    for (;;) {
      GenerationEvent ev;
      const bool got = state->next_for(kPollMs, ev);
      if (watch->gone()) {
        state->cancel();
        return client_gone(res);
      }
      if (!got) continue;
      if (ev.kind == GenerationEvent::Kind::kError) throw event_error(ev, res);
      if (ev.kind == GenerationEvent::Kind::kDone) {
        send_json(res, 200,
                  completion_response(ctx, text, ev.finish_reason, ev.timings,
                                      r.return_token_ids ? &state->request.prompt : nullptr,
                                      r.return_token_ids ? &ids : nullptr));
        return;
      }
      text += ev.text;
      ids.insert(ids.end(), ev.tokens.begin(), ev.tokens.end());
    }
  }
  const bool with_ids = r.return_token_ids, usage = r.include_usage;
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream", [state, ctx, with_ids, usage, watch](size_t, httplib::DataSink& sink) {
        auto send = [&](const json& j) {
          const std::string line =
              "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
          return sink.write(line.data(), line.size());
        };
        bool first = true;
        for (;;) {
          GenerationEvent ev;
          const bool got = state->next_for(kPollMs, ev);
          if (watch->gone()) {  // client went away: stop generating for it
            state->cancel();
            return false;
          }
          if (!got) continue;
          if (ev.kind == GenerationEvent::Kind::kError) {
            send(error_body(ApiError(500, ev.error, "server_error")));
            break;
          }
          if (ev.kind == GenerationEvent::Kind::kDone) {
            json last = stream_chunk(ctx, "", false, ev.finish_reason, nullptr);
            if (usage) last["usage"] = nullptr;
            send(last);
            if (usage) {
              json u = stream_chunk(ctx, "", false, "", nullptr);
              u["choices"] = json::array();
              u["usage"] = usage_json(ev.timings);
              u["timings"] = timings_json(ev.timings);
              send(u);
            }
            break;
          }
          json chunk = stream_chunk(ctx, ev.text, first, "", with_ids ? &ev.tokens : nullptr);
          first = false;
          if (!send(chunk)) {  // client went away: stop generating for it
            state->cancel();
            return false;
          }
        }
        const std::string done = "data: [DONE]\n\n";
        sink.write(done.data(), done.size());
        sink.done();
        return true;
      });
}

}  // namespace ninfer
