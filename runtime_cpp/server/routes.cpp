#include "server/routes.h"

#include <algorithm>
#include <cstdint>
#include <ctime>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/anthropic.h"
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

httplib::Server::Handler guarded(HttpHandler fn, ErrorShape shape) {
  return [fn, shape](const httplib::Request& req, httplib::Response& res) {
    auto body = [shape](const ApiError& e) {
      return shape == ErrorShape::kAnthropic ? anthropic::error_body(e) : error_body(e);
    };
    try {
      fn(req, res);
    } catch (const ApiError& e) {
      send_json(res, e.status, body(e));
    } catch (const std::exception& e) {
      send_json(res, 500, body(ApiError(500, e.what(), "server_error")));
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

json Routes::model_entry(const std::string& name) const {
  const ModelInfo& info = engine.info();
  return {{"id", name},
          {"object", "model"},
          {"created", 0},
          {"owned_by", "ninfer"},
          {"root", info.model_id},
          {"max_model_len", engine.max_context()},
          {"vocab_size", info.vocab_size},
          {"target", info.target}};
}

void Routes::models(const httplib::Request&, httplib::Response& res) const {
  json data = json::array();
  for (const auto& name : model_names) data.push_back(model_entry(name));
  send_json(res, 200, {{"object", "list"}, {"data", std::move(data)}});
}

void Routes::model(const httplib::Request& req, httplib::Response& res) const {
  const std::string id = req.matches.size() > 1 ? req.matches[1].str() : "";
  if (std::find(model_names.begin(), model_names.end(), id) == model_names.end())
    throw ApiError(404, "The model '" + id + "' does not exist", "invalid_request_error", "model",
                   "model_not_found");
  send_json(res, 200, model_entry(id));
}

void Routes::chat_completions(const httplib::Request& req, httplib::Response& res) const {
  generate(req, res, true);
}

void Routes::completions(const httplib::Request& req, httplib::Response& res) const {
  generate(req, res, false);
}

void not_found(const httplib::Request& req, httplib::Response& res) {
  if (res.status == 404 && res.body.empty())
    send_json(res, 404,
              error_body(ApiError(404, "no route " + req.method + " " + req.path,
                                  "invalid_request_error", "", "not_found")));
}

void internal_error(const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
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
  if (r.chat) {
    std::string text;
    try {
      text = chat.render(r.messages, /*add_generation_prompt=*/true);
    } catch (const std::invalid_argument& e) {
      throw ApiError(400, e.what(), "invalid_request_error", "messages");
    }
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
  const CompletionRequest r =
      parse_completion_request(req.body, is_chat, model_names, engine.info().vocab_size);
  GenerationSink sink;
  sink.response = [](httplib::Response& res, const json& j) { send_json(res, 200, j); };
  sink.chunk = [](httplib::DataSink& out, const json& j) {
    const std::string line =
        "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
    return out.write(line.data(), line.size());
  };
  sink.end = [](httplib::DataSink& out) {
    const std::string done = "data: [DONE]\n\n";
    out.write(done.data(), done.size());
  };
  run(req, res, r, std::move(sink));
}

namespace {

// Counts a generation in Routes::in_flight while it lives.
struct InFlight {
  explicit InFlight(std::atomic<int>& n) : n(n) { ++n; }
  ~InFlight() { --n; }
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;
  std::atomic<int>& n;
};

// vLLM's choices[].stop_reason: the stop string that ended the text, else null.
json stop_reason_json(const GenerationEvent& done) {
  return done.stop_sequence.empty() ? json(nullptr) : json(done.stop_sequence);
}

}  // namespace

void Routes::run(const httplib::Request& req, httplib::Response& res, const CompletionRequest& r,
                 GenerationSink sink, std::string id) const {
  auto counted = std::make_shared<InFlight>(in_flight);
  const bool is_chat = r.chat;
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
  ResponseContext ctx{id.empty() ? new_request_id(is_chat) : std::move(id),
                      static_cast<int64_t>(std::time(nullptr)), r.model, is_chat};
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
        json out = completion_response(ctx, text, ev.finish_reason, ev.timings,
                                       r.return_token_ids ? &state->request.prompt : nullptr,
                                       r.return_token_ids ? &ids : nullptr);
        out["choices"][0]["stop_reason"] = stop_reason_json(ev);
        sink.response(res, out);
        return;
      }
      text += ev.text;
      ids.insert(ids.end(), ev.tokens.begin(), ev.tokens.end());
    }
  }
  const bool with_ids = r.return_token_ids, usage = r.include_usage;
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider("text/event-stream", [state, ctx, with_ids, usage, watch, sink,
                                                         counted](size_t, httplib::DataSink& out) {
    auto send = [&](const json& j) { return sink.chunk(out, j); };
    if (sink.begin && !sink.begin(out, static_cast<int>(state->request.prompt.size()))) {
      state->cancel();
      return false;
    }
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
        send(error_body(ApiError(500, ev.error, "server_error", "", ev.error_code)));
        break;
      }
      if (ev.kind == GenerationEvent::Kind::kDone) {
        json last = stream_chunk(ctx, "", false, ev.finish_reason, nullptr);
        last["choices"][0]["stop_reason"] = stop_reason_json(ev);
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
    sink.end(out);
    out.done();
    return true;
  });
}

void Routes::messages(const httplib::Request& req, httplib::Response& res) const {
  const json oa = anthropic::to_openai_request(parse_body(req.body));
  const CompletionRequest r =
      parse_completion_request(oa, /*chat=*/true, model_names, engine.info().vocab_size);
  const std::string id = anthropic::new_message_id();
  GenerationSink sink;
  sink.response = [id](httplib::Response& res, const json& completion) {
    send_json(res, 200, anthropic::from_openai_response(completion, id));
  };
  // One translator per stream; the sink's callbacks run on the stream's thread in turn.
  auto translator = std::make_shared<anthropic::StreamTranslator>(id, r.model, 0);
  auto write = [](httplib::DataSink& out, const std::vector<anthropic::Event>& events) {
    for (const auto& e : events) {
      const std::string text = e.sse();
      if (!out.write(text.data(), text.size())) return false;
    }
    return true;
  };
  sink.begin = [translator, id, model = r.model, write](httplib::DataSink& out, int prompt_tokens) {
    *translator = anthropic::StreamTranslator(id, model, prompt_tokens);
    return write(out, translator->start());
  };
  sink.chunk = [translator, write](httplib::DataSink& out, const json& chunk) {
    return write(out, translator->feed(chunk));
  };
  sink.end = [translator, write](httplib::DataSink& out) { write(out, translator->finish()); };
  run(req, res, r, std::move(sink), id);
}

void Routes::count_tokens(const httplib::Request& req, httplib::Response& res) const {
  const json oa = anthropic::to_openai_request(parse_body(req.body), /*count_tokens=*/true);
  const CompletionRequest r =
      parse_completion_request(oa, /*chat=*/true, model_names, engine.info().vocab_size);
  send_json(res, 200, {{"input_tokens", prompt_tokens(r).size()}});
}

namespace {

bool flag(const json& body, const char* key, bool dflt) {
  if (!body.contains(key) || body[key].is_null()) return dflt;
  if (!body[key].is_boolean())
    throw ApiError(400, std::string("'") + key + "' must be a boolean", "invalid_request_error",
                   key);
  return body[key].get<bool>();
}

}  // namespace

void Routes::tokenize(const httplib::Request& req, httplib::Response& res) const {
  json body = parse_body(req.body);
  const bool chat_form = body.contains("messages");
  if (chat_form == body.contains("prompt"))
    throw ApiError(400, "send either 'prompt' (a string) or 'messages' (a chat)",
                   "invalid_request_error", "prompt");
  if (flag(body, "return_token_strs", false))
    throw ApiError(400, "'return_token_strs' is not supported", "invalid_request_error",
                   "return_token_strs");
  std::vector<int32_t> ids;
  if (chat_form) {
    // The prompt a chat request would get, through the same chat path.
    if (flag(body, "add_special_tokens", false))
      throw ApiError(400,
                     "'add_special_tokens' must be false with 'messages' (the chat template "
                     "places the special tokens)",
                     "invalid_request_error", "add_special_tokens");
    if (!flag(body, "add_generation_prompt", true))
      throw ApiError(400, "'add_generation_prompt': false is not supported",
                     "invalid_request_error", "add_generation_prompt");
    if (flag(body, "continue_final_message", false))
      throw ApiError(400, "'continue_final_message' is not supported", "invalid_request_error",
                     "continue_final_message");
    for (const char* key : {"add_special_tokens", "add_generation_prompt", "continue_final_message",
                            "return_token_strs"})
      body.erase(key);
    ids = prompt_tokens(
        parse_completion_request(body, /*chat=*/true, model_names, engine.info().vocab_size));
  } else {
    requested_model(body, model_names);
    if (!body["prompt"].is_string())
      throw ApiError(400, "'prompt' must be a string", "invalid_request_error", "prompt");
    ids =
        tokenizer.encode(body["prompt"].get<std::string>(), flag(body, "add_special_tokens", true));
  }
  send_json(res, 200,
            {{"count", ids.size()}, {"max_model_len", engine.max_context()}, {"tokens", ids}});
}

void Routes::detokenize(const httplib::Request& req, httplib::Response& res) const {
  const json body = parse_body(req.body);
  requested_model(body, model_names);
  const int vocab = engine.info().vocab_size;
  if (!body.contains("tokens") || !body["tokens"].is_array())
    throw ApiError(400, "'tokens' must be an array of token ids", "invalid_request_error",
                   "tokens");
  std::vector<int32_t> ids;
  for (const json& t : body["tokens"]) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= vocab)
      throw ApiError(400,
                     "'tokens' entries must be integers in [0, " + std::to_string(vocab) +
                         "), got " + t.dump(),
                     "invalid_request_error", "tokens");
    ids.push_back(t.get<int32_t>());
  }
  send_json(res, 200, {{"prompt", tokenizer.decode(ids, /*skip_special_tokens=*/false)}});
}

}  // namespace ninfer
