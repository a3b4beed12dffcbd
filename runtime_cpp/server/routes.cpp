#include "server/routes.h"

#include <algorithm>
#include <cstdint>
#include <ctime>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "server/anthropic.h"
#include "server/api.h"
#include "server/chat_output.h"
#include "server/client_watch.h"
#include "server/logprobs_json.h"
#include "server/random_id.h"
#include "server/structured_output.h"

namespace ninfer {
namespace {

using nlohmann::json;

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

// Where a chat prompt leaves the reasoning block, as the grammars take it.
ToolReasoning grammar_reasoning(ReasoningFormat format, const std::string& prompt) {
  switch (reasoning_start(format, prompt)) {
    case ReasoningStart::kInside: return ToolReasoning::kInsideThink;
    case ReasoningStart::kMaybe: return ToolReasoning::kThinkBlock;
    default: return ToolReasoning::kNone;
  }
}

void client_gone(httplib::Response& res) {
  // Nobody reads this; 499 is nginx's "client closed request".
  send_json(res, 499, error_body(ApiError(499, "client closed the connection", "server_error")));
}

}  // namespace

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

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
  const backend::GraphCounts graphs = backend::graph_counts();
  if (graphs.available) metrics.set_cuda_graphs(graphs.captured, graphs.replays);
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

std::vector<int32_t> Routes::prompt_tokens(const CompletionRequest& r,
                                           std::string* rendered) const {
  if (r.prompt_ids) return *r.prompt_ids;
  if (r.chat) {
    std::string text = chat.render(r);
    if (rendered) *rendered = text;
    return tokenizer.encode(text, /*add_special_tokens=*/false);
  }
  return tokenizer.encode(r.prompt, /*add_special_tokens=*/true);
}

TokenConstraints Routes::forced_tool_call(const CompletionRequest& r,
                                          const std::string& prompt) const {
  const bool forced =
      (r.tool_choice.is_string() && r.tool_choice == "required") || r.tool_choice.is_object();
  if (!forced) return {};
  if (output.parsers.tool_calls == ToolCallFormat::kNone)
    throw ApiError(400,
                   "this server has no tool-call format (the chat template shows none; set "
                   "--tool-call-parser), so it cannot force a tool call",
                   "invalid_request_error", "tool_choice");
  if (!grammars)
    throw ApiError(400, "forcing a tool call needs the grammar engine, which this server lacks",
                   "invalid_request_error", "tool_choice");
  return tool_choice_constraints(*grammars, format_name(output.parsers.tool_calls), r.tools,
                                 r.tool_choice,
                                 grammar_reasoning(output.parsers.reasoning, prompt));
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
  } catch (const std::invalid_argument& e) {  // e.g. n out of range (admission.cpp)
    throw ApiError(400, e.what(), "invalid_request_error");
  }
}

namespace {

// What one choice of a request produced so far.
struct ChoiceOut {
  std::string text;
  std::vector<int32_t> ids;
  std::vector<TokenLogprob> logprobs;
  std::string finish_reason;
  Timings timings;
  bool first = true;                // streaming: no delta sent yet
  size_t text_offset = 0;           // completions logprobs: characters sent so far
  std::shared_ptr<ChatOutput> out;  // chat: the choice's reasoning and tool calls
  std::string stop_sequence;        // the stop string that ended it, if any
};

// A request's usage over its choices: the prompt once, the completion tokens summed.
Timings request_timings(const std::vector<ChoiceOut>& choices) {
  Timings t = choices[0].timings;
  t.predicted_n = 0;
  if (t.draft_n >= 0) t.draft_n = t.draft_accepted_n = 0;
  for (const ChoiceOut& c : choices) {
    t.predicted_n += c.timings.predicted_n;
    if (t.draft_n >= 0 && c.timings.draft_n >= 0) {
      t.draft_n += c.timings.draft_n;
      t.draft_accepted_n += c.timings.draft_accepted_n;
    }
    t.predicted_ms = std::max(t.predicted_ms, c.timings.predicted_ms);
  }
  return t;
}

// Adds the choices' reasoning tokens (completion_tokens_details) to a chat usage object.
void add_chat_usage(const std::vector<ChoiceOut>& choices, json& usage) {
  if (choices.empty() || !choices[0].out) return;
  int reasoning = 0;
  bool any = false;
  for (const ChoiceOut& c : choices) {
    json one = usage;
    c.out->add_usage(one);
    if (one.contains("completion_tokens_details")) {
      any = true;
      reasoning += one["completion_tokens_details"].value("reasoning_tokens", 0);
    }
  }
  if (any) usage["completion_tokens_details"] = {{"reasoning_tokens", reasoning}};
}

}  // namespace

json Routes::logprobs_json(bool chat, const std::vector<TokenLogprob>& lps, size_t& text_offset,
                           bool as_ids) const {
  return chat ? chat_logprobs_json(tokenizer, lps, as_ids)
              : completion_logprobs_json(tokenizer, lps, text_offset, as_ids);
}

void Routes::generate(const httplib::Request& req, httplib::Response& res, bool is_chat) const {
  CompletionRequest r =
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
  run(req, res, std::move(r), std::move(sink));
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
json stop_reason_json(const std::string& stop_sequence) {
  return stop_sequence.empty() ? json(nullptr) : json(stop_sequence);
}

}  // namespace

void Routes::run(const httplib::Request& req, httplib::Response& res, CompletionRequest r,
                 GenerationSink sink, std::string id) const {
  auto counted = std::make_shared<InFlight>(in_flight);
  const bool is_chat = r.chat;
  if (r.n > engine.max_concurrency())
    throw ApiError(400,
                   "n = " + std::to_string(r.n) + " is above this server's limit of " +
                       std::to_string(engine.max_concurrency()) +
                       " (the choices run at once, one request slot each: --max-concurrency)",
                   "invalid_request_error", "n");
  apply_generation_defaults(r, defaults);
  GenerationRequest g;
  std::string rendered;
  g.prompt = prompt_tokens(r, &rendered);
  // Each chat choice parses its own reasoning and tool calls (one ChatOutput per choice);
  // the constraints are choice 0's, the engine copies them for the others (constraint.h).
  const int n = r.n;
  auto choices_ptr = std::make_shared<std::vector<ChoiceOut>>(n);
  if (is_chat) {
    for (ChoiceOut& c : *choices_ptr)
      c.out = std::make_shared<ChatOutput>(output, r, rendered, tokenizer);
    if (auto c = (*choices_ptr)[0].out->constraint()) g.constraints.push_back(c);
  }
  if (g.prompt.empty())
    throw ApiError(400, "the prompt is empty after tokenization", "invalid_request_error",
                   is_chat ? "messages" : "prompt");
  g.max_tokens = r.max_tokens;  // -1: the engine fills what the context and pool allow
  if (r.given.count("max_tokens") == 0 && defaults.max_tokens) {
    // generation_config's max_new_tokens, within what the context leaves (vLLM).
    const int room = std::min(engine.max_context(), engine.max_positions() + 1) -
                     static_cast<int>(g.prompt.size());
    if (room >= 1) g.max_tokens = std::min(*defaults.max_tokens, room);
  }
  if (r.min_tokens > 0 && g.max_tokens >= 0 && r.min_tokens > g.max_tokens)
    throw ApiError(400,
                   "'min_tokens' (" + std::to_string(r.min_tokens) + ") is above max_tokens (" +
                       std::to_string(g.max_tokens) + ")",
                   "invalid_request_error", "min_tokens");
  g.sampling = r.sampling;
  // Choice i samples with seed + i (engine/request.h).
  g.seed = r.seed ? *r.seed : static_cast<uint32_t>(os_random());
  g.stop = r.stop;
  g.ignore_eos = r.ignore_eos;
  g.n = r.n;
  g.min_tokens = r.min_tokens;
  g.stop_token_ids = r.stop_token_ids;
  g.logprobs = r.logprobs;
  // On a thinking chat the grammar applies to the answer, after the reasoning (vLLM).
  const ToolReasoning reasoning =
      is_chat ? grammar_reasoning(output.parsers.reasoning, rendered) : ToolReasoning::kNone;
  for (auto& c : structured_output_constraints(r, grammars, tokenizer, reasoning))
    g.constraints.push_back(std::move(c));
  if (is_chat) {  // tool_choice "required" or a named function: the grammar forces the call
    for (auto& c : forced_tool_call(r, rendered)) g.constraints.push_back(std::move(c));
  }
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

  const bool with_ids = r.return_token_ids, with_logprobs = r.logprobs >= 0;
  const bool as_ids = r.return_tokens_as_token_ids;
  if (!r.stream) {
    std::vector<ChoiceOut>& choices = *choices_ptr;
    int done = 0;
    for (;;) {
      GenerationEvent ev;
      const bool got = state->next_for(kPollMs, ev);
      if (watch->gone()) {
        state->cancel();
        return client_gone(res);
      }
      if (!got) continue;
      if (ev.kind == GenerationEvent::Kind::kError) throw event_error(ev, res);
      ChoiceOut& c = choices[ev.index];
      if (ev.kind == GenerationEvent::Kind::kDone) {
        c.finish_reason = ev.finish_reason;
        c.stop_sequence = ev.stop_sequence;
        c.timings = ev.timings;
        if (++done < n) continue;
        const Timings total = request_timings(choices);
        json out = completion_response(ctx, choices[0].text, choices[0].finish_reason, total,
                                       with_ids ? &state->request.prompt : nullptr,
                                       with_ids ? &choices[0].ids : nullptr);
        json list = json::array();
        for (int i = 0; i < n; ++i) {
          ChoiceOut& ci = choices[i];
          json one = i == 0
                         ? out["choices"][0]
                         : completion_response(ctx, ci.text, ci.finish_reason, ci.timings, nullptr,
                                               with_ids ? &ci.ids : nullptr)["choices"][0];
          one["index"] = i;
          one["stop_reason"] = stop_reason_json(ci.stop_sequence);
          if (with_logprobs)
            one["logprobs"] = logprobs_json(is_chat, ci.logprobs, ci.text_offset, as_ids);
          if (ci.out) {
            ci.out->on_done();
            one["message"] = ci.out->message();
            one["finish_reason"] = ci.out->finish_reason(ci.finish_reason);
          }
          list.push_back(std::move(one));
        }
        out["choices"] = std::move(list);
        add_chat_usage(*choices_ptr, out["usage"]);
        sink.response(res, out);
        return;
      }
      c.text += ev.text;
      c.ids.insert(c.ids.end(), ev.tokens.begin(), ev.tokens.end());
      c.logprobs.insert(c.logprobs.end(), ev.logprobs.begin(), ev.logprobs.end());
      if (c.out) c.out->on_text(ev.text, ev.tokens);
    }
  }
  const bool usage = r.include_usage;
  res.set_header("Cache-Control", "no-cache");
  auto choices = choices_ptr;
  res.set_chunked_content_provider(
      "text/event-stream", [this, state, ctx, with_ids, with_logprobs, as_ids, usage, watch,
                            choices, n, is_chat, sink, counted](size_t, httplib::DataSink& out) {
        auto send = [&](const json& j) { return sink.chunk(out, j); };
        if (sink.begin && !sink.begin(out, static_cast<int>(state->request.prompt.size()))) {
          state->cancel();
          return false;
        }
        // A chat choice's parsed deltas, one chunk each (the first keeps role); none while
        // the parser holds text back, unless the chunk must carry token ids or logprobs.
        auto send_deltas = [&](ChoiceOut& c, int index, std::vector<json> deltas,
                               const std::vector<int32_t>* ids,
                               const std::vector<TokenLogprob>* lps = nullptr) {
          if (deltas.empty() && (ids || (lps && !lps->empty()))) deltas.push_back(json::object());
          for (size_t i = 0; i < deltas.size(); ++i) {
            json chunk = stream_chunk(ctx, "", c.first, "", i == 0 ? ids : nullptr);
            json& choice = chunk["choices"][0];
            choice["index"] = index;
            if (i == 0 && lps && with_logprobs)
              choice["logprobs"] = logprobs_json(is_chat, *lps, c.text_offset, as_ids);
            json& delta = choice["delta"];
            delta.erase("content");
            delta.update(deltas[i]);
            c.first = false;
            if (!send(chunk)) {  // client went away: stop generating for it
              state->cancel();
              return false;
            }
          }
          return true;
        };
        int done = 0;
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
          ChoiceOut& c = (*choices)[ev.index];
          if (ev.kind == GenerationEvent::Kind::kDone) {
            c.timings = ev.timings;
            if (c.out && !send_deltas(c, ev.index, c.out->on_done(), nullptr)) return false;
            json last = stream_chunk(
                ctx, "", false, c.out ? c.out->finish_reason(ev.finish_reason) : ev.finish_reason,
                nullptr);
            last["choices"][0]["index"] = ev.index;
            last["choices"][0]["stop_reason"] = stop_reason_json(ev.stop_sequence);
            if (usage) last["usage"] = nullptr;
            send(last);
            if (++done < n) continue;
            if (usage) {
              const Timings total = request_timings(*choices);
              json u = stream_chunk(ctx, "", false, "", nullptr);
              u["choices"] = json::array();
              u["usage"] = usage_json(total);
              add_chat_usage(*choices, u["usage"]);
              u["timings"] = timings_json(total);
              send(u);
            }
            break;
          }
          if (c.out) {
            if (!send_deltas(c, ev.index, c.out->on_text(ev.text, ev.tokens),
                             with_ids ? &ev.tokens : nullptr, &ev.logprobs))
              return false;
            continue;
          }
          json chunk = stream_chunk(ctx, ev.text, c.first, "", with_ids ? &ev.tokens : nullptr);
          chunk["choices"][0]["index"] = ev.index;
          if (with_logprobs)
            chunk["choices"][0]["logprobs"] =
                logprobs_json(is_chat, ev.logprobs, c.text_offset, as_ids);
          c.first = false;
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

namespace {

// A Messages body as the chat-completions body text it becomes, keys in their order.
std::string anthropic_as_openai(const std::string& body, bool count_tokens) {
  parse_body(body);  // a body that is not JSON: the usual 400
  return anthropic::to_openai_request(nlohmann::ordered_json::parse(body), count_tokens).dump();
}

}  // namespace

void Routes::messages(const httplib::Request& req, httplib::Response& res) const {
  const CompletionRequest r = parse_completion_request(
      anthropic_as_openai(req.body, false), /*chat=*/true, model_names, engine.info().vocab_size);
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
  const CompletionRequest r =
      parse_completion_request(anthropic_as_openai(req.body, /*count_tokens=*/true),
                               /*chat=*/true, model_names, engine.info().vocab_size);
  send_json(res, 200, {{"input_tokens", prompt_tokens(r).size()}});
}

}  // namespace ninfer
