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
#include "server/chat_output.h"
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

std::vector<int32_t> Routes::prompt_tokens(const CompletionRequest& r,
                                           std::string* rendered) const {
  if (r.prompt_ids) return *r.prompt_ids;
  if (r.chat) {
    std::string text;
    const nlohmann::json& thinking =
        r.chat_template_kwargs.is_object()
            ? r.chat_template_kwargs.value("enable_thinking", json(true))
            : json(true);
    try {
      text = chat.render(r.messages, /*add_generation_prompt=*/true,
                         !thinking.is_boolean() || thinking.get<bool>());
    } catch (const std::invalid_argument& e) {
      throw ApiError(400, e.what(), "invalid_request_error", "messages");
    }
    if (rendered) *rendered = text;
    return tokenizer.encode(text, /*add_special_tokens=*/false);
  }
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
  std::string rendered;
  g.prompt = prompt_tokens(r, &rendered);
  // A chat choice's reasoning and tool calls (one ChatOutput per choice).
  std::shared_ptr<ChatOutput> out;
  if (is_chat) {
    out = std::make_shared<ChatOutput>(output, r, rendered, tokenizer);
    if (auto c = out->constraint()) g.constraints.push_back(c);
  }
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
        json body = completion_response(ctx, text, ev.finish_reason, ev.timings,
                                        r.return_token_ids ? &state->request.prompt : nullptr,
                                        r.return_token_ids ? &ids : nullptr);
        if (out) {
          out->on_done();
          json& choice = body["choices"][0];
          choice["message"] = out->message();
          choice["finish_reason"] = out->finish_reason(ev.finish_reason);
          out->add_usage(body["usage"]);
        }
        send_json(res, 200, body);
        return;
      }
      text += ev.text;
      ids.insert(ids.end(), ev.tokens.begin(), ev.tokens.end());
      if (out) out->on_text(ev.text, ev.tokens);
    }
  }
  const bool with_ids = r.return_token_ids, usage = r.include_usage;
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider("text/event-stream", [state, ctx, with_ids, usage, watch, out](
                                                            size_t, httplib::DataSink& sink) {
    auto send = [&](const json& j) {
      const std::string line =
          "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
      return sink.write(line.data(), line.size());
    };
    bool first = true;
    // A chat choice's parsed deltas, one chunk each (the first keeps role); none while
    // the parser holds text back, unless the chunk must carry token ids.
    auto send_deltas = [&](std::vector<json> deltas, const std::vector<int32_t>* ids) {
      if (deltas.empty() && ids) deltas.push_back(json::object());
      for (size_t i = 0; i < deltas.size(); ++i) {
        json chunk = stream_chunk(ctx, "", first, "", i == 0 ? ids : nullptr);
        json& delta = chunk["choices"][0]["delta"];
        delta.erase("content");
        delta.update(deltas[i]);
        first = false;
        if (!send(chunk)) {  // client went away: stop generating for it
          state->cancel();
          return false;
        }
      }
      return true;
    };
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
        if (out && !send_deltas(out->on_done(), nullptr)) return false;
        json last = stream_chunk(
            ctx, "", false, out ? out->finish_reason(ev.finish_reason) : ev.finish_reason, nullptr);
        if (usage) last["usage"] = nullptr;
        send(last);
        if (usage) {
          json u = stream_chunk(ctx, "", false, "", nullptr);
          u["choices"] = json::array();
          u["usage"] = usage_json(ev.timings);
          if (out) out->add_usage(u["usage"]);
          u["timings"] = timings_json(ev.timings);
          send(u);
        }
        break;
      }
      if (out) {
        if (!send_deltas(out->on_text(ev.text, ev.tokens), with_ids ? &ev.tokens : nullptr))
          return false;
        continue;
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
