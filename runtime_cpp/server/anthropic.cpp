#include "server/anthropic.h"

#include <algorithm>
#include <set>
#include <utility>

#include "server/random_id.h"

namespace ninfer::anthropic {

using nlohmann::json;
// The request side keeps the body's key order: a tool's input_schema reaches the chat
// template, and an output_config schema the grammar, with their properties as written.
using ojson = nlohmann::ordered_json;

namespace {

// usage.prompt_tokens_details.cached_tokens of an OpenAI usage object (0 when absent).
int cached_tokens(const json& usage) {
  if (!usage.contains("prompt_tokens_details") || !usage["prompt_tokens_details"].is_object())
    return 0;
  const json& d = usage["prompt_tokens_details"];
  return d.contains("cached_tokens") && d["cached_tokens"].is_number_integer()
             ? d["cached_tokens"].get<int>()
             : 0;
}

[[noreturn]] void bad(const std::string& param, const std::string& msg) {
  throw ApiError(400, msg, "invalid_request_error", param);
}

void only_fields(const ojson& obj, const std::set<std::string>& allowed, const std::string& where) {
  for (const auto& [key, value] : obj.items())
    if (!allowed.count(key))
      bad(where.empty() ? key : where + "." + key,
          (where.empty() ? "" : where + ": ") + "'" + key + "' is not supported");
}

const ojson& need(const ojson& obj, const char* key, const std::string& where) {
  if (!obj.contains(key) || obj[key].is_null())
    bad(where + "." + key, where + "." + key + " is required");
  return obj[key];
}

std::string need_string(const ojson& obj, const char* key, const std::string& where) {
  const ojson& v = need(obj, key, where);
  if (!v.is_string()) bad(where + "." + key, where + "." + key + " must be a string");
  return v.get<std::string>();
}

// One string for a single text, OpenAI content parts for several.
ojson text_content(const std::vector<std::string>& texts) {
  if (texts.empty()) return "";
  if (texts.size() == 1) return texts[0];
  ojson parts = ojson::array();
  for (const auto& t : texts) parts.push_back({{"type", "text"}, {"text", t}});
  return parts;
}

std::string block_type(const ojson& block, const std::string& where) {
  if (!block.is_object()) bad(where, where + " must be a content block object");
  return need_string(block, "type", where);
}

[[noreturn]] void unsupported_block(const std::string& type, const std::string& where) {
  bad(where,
      where + ": content blocks of type '" + type + "' are not supported" +
          (type == "image" || type == "document" ? " (this server serves a text-only model)" : ""));
}

// A text block's text; its hints (cache_control, citations) do not change the prompt.
std::string text_block(const ojson& block, const std::string& where) {
  only_fields(block, {"type", "text", "cache_control", "citations"}, where);
  return need_string(block, "text", where);
}

// `system` and tool_result `content`: a string or an array of text blocks.
ojson texts_of(const ojson& content, const std::string& where) {
  if (content.is_string()) return content;
  if (!content.is_array()) bad(where, where + " must be a string or an array of text blocks");
  std::vector<std::string> texts;
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string w = where + "[" + std::to_string(i) + "]";
    const std::string type = block_type(content[i], w);
    if (type != "text") unsupported_block(type, w);
    texts.push_back(text_block(content[i], w));
  }
  return text_content(texts);
}

ojson tool_call(const ojson& block, const std::string& where) {
  only_fields(block, {"type", "id", "name", "input", "cache_control", "caller"}, where);
  const ojson& input = need(block, "input", where);
  if (!input.is_object()) bad(where + ".input", where + ".input must be an object");
  return {{"id", need_string(block, "id", where)},
          {"type", "function"},
          {"function",
           {{"name", need_string(block, "name", where)},
            {"arguments", input.dump(-1, ' ', false, ojson::error_handler_t::replace)}}}};
}

// One turn (consecutive messages of a role, their blocks in order) as OpenAI messages.
void translate_turn(const std::string& role,
                    const std::vector<std::pair<ojson, std::string>>& blocks, ojson& out) {
  std::vector<std::string> texts, thinking;
  ojson tool_calls = ojson::array(), tool_results = ojson::array();
  for (const auto& [block, where] : blocks) {
    const std::string type = block_type(block, where);
    if (type == "text") {
      texts.push_back(text_block(block, where));
    } else if (type == "tool_use" && role == "assistant") {
      tool_calls.push_back(tool_call(block, where));
    } else if (type == "thinking" && role == "assistant") {
      only_fields(block, {"type", "thinking", "signature"}, where);
      thinking.push_back(need_string(block, "thinking", where));
    } else if (type == "tool_result" && role == "user") {
      // is_error only flags the content, which says what went wrong.
      only_fields(block, {"type", "tool_use_id", "content", "is_error", "cache_control"}, where);
      ojson content = block.contains("content") && !block["content"].is_null()
                          ? texts_of(block["content"], where + ".content")
                          : ojson("");
      tool_results.push_back({{"role", "tool"},
                              {"tool_call_id", need_string(block, "tool_use_id", where)},
                              {"content", std::move(content)}});
    } else if (type == "tool_use" || type == "thinking" || type == "tool_result") {
      bad(where, where + ": a '" + type + "' block belongs in " +
                     (type == "tool_result" ? "a user" : "an assistant") + " message");
    } else {
      unsupported_block(type, where);
    }
  }
  if (role == "user") {
    // Tool results answer the assistant's calls, so they come right after them.
    for (auto& m : tool_results) out.push_back(std::move(m));
    if (!texts.empty() || tool_results.empty())
      out.push_back({{"role", "user"}, {"content", text_content(texts)}});
    return;
  }
  ojson m = {{"role", "assistant"}};
  m["content"] = texts.empty() && !tool_calls.empty() ? ojson(nullptr) : text_content(texts);
  if (!thinking.empty()) {
    std::string r;
    for (const auto& t : thinking) r += t;
    m["reasoning_content"] = r;
  }
  if (!tool_calls.empty()) m["tool_calls"] = std::move(tool_calls);
  out.push_back(std::move(m));
}

ojson translate_messages(const ojson& body) {
  ojson out = ojson::array();
  if (body.contains("system") && !body["system"].is_null()) {
    ojson system = texts_of(body["system"], "system");
    if (!(system.is_string() && system.get<std::string>().empty()))
      out.push_back({{"role", "system"}, {"content", std::move(system)}});
  }
  if (!body.contains("messages")) bad("messages", "'messages' is required");
  const ojson& msgs = body["messages"];
  if (!msgs.is_array() || msgs.empty())
    bad("messages", "'messages' must be a non-empty array of messages");
  // Consecutive turns of one role are combined into one, as Anthropic does.
  std::vector<std::pair<std::string, std::vector<std::pair<ojson, std::string>>>> turns;
  for (size_t i = 0; i < msgs.size(); ++i) {
    const std::string where = "messages[" + std::to_string(i) + "]";
    const ojson& m = msgs[i];
    if (!m.is_object()) bad(where, where + " must be an object");
    only_fields(m, {"role", "content"}, where);
    const std::string role = need_string(m, "role", where);
    if (role != "user" && role != "assistant")
      bad(where + ".role", where +
                               ".role must be 'user' or 'assistant' (the system prompt goes "
                               "in the top-level 'system'), got '" +
                               role + "'");
    if (turns.empty() || turns.back().first != role) turns.push_back({role, {}});
    auto& blocks = turns.back().second;
    const ojson& content = need(m, "content", where);
    if (content.is_string()) {
      blocks.push_back({ojson{{"type", "text"}, {"text", content}}, where + ".content"});
    } else if (content.is_array()) {
      for (size_t j = 0; j < content.size(); ++j)
        blocks.push_back({content[j], where + ".content[" + std::to_string(j) + "]"});
    } else {
      bad(where + ".content", where + ".content must be a string or an array of content blocks");
    }
  }
  if (turns.back().first == "assistant")
    bad("messages",
        "a final assistant message (prefill: continuing the assistant's text) is not supported; "
        "end the conversation with a user message");
  for (const auto& [role, blocks] : turns) translate_turn(role, blocks, out);
  return out;
}

ojson translate_tools(const ojson& tools) {
  if (!tools.is_array()) bad("tools", "'tools' must be an array");
  ojson out = ojson::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string where = "tools[" + std::to_string(i) + "]";
    const ojson& t = tools[i];
    if (!t.is_object()) bad(where, where + " must be an object");
    if (t.contains("type") && !t["type"].is_null() && t["type"] != "custom")
      bad(where + ".type", where + ": tools of type " + t["type"].dump() +
                               " (Anthropic's server tools) are not supported; only custom tools "
                               "with name, description and input_schema");
    // cache_control, defer_loading, eager_input_streaming: hints, not the prompt.
    only_fields(t,
                {"type", "name", "description", "input_schema", "strict", "cache_control",
                 "defer_loading", "eager_input_streaming"},
                where);
    ojson fn = {{"name", need_string(t, "name", where)}};
    if (t.contains("description") && !t["description"].is_null()) {
      if (!t["description"].is_string())
        bad(where + ".description", where + ".description must be a string");
      fn["description"] = t["description"];
    }
    const ojson& schema = need(t, "input_schema", where);
    if (!schema.is_object())
      bad(where + ".input_schema", where + ".input_schema must be an object");
    fn["parameters"] = schema;
    if (t.contains("strict") && !t["strict"].is_null()) fn["strict"] = t["strict"];
    out.push_back({{"type", "function"}, {"function", std::move(fn)}});
  }
  return out;
}

void translate_tool_choice(const ojson& tc, ojson& out) {
  if (!tc.is_object()) bad("tool_choice", "'tool_choice' must be an object with a 'type'");
  const std::string type = need_string(tc, "type", "tool_choice");
  only_fields(tc, {"type", "name", "disable_parallel_tool_use"}, "tool_choice");
  if (type == "auto") out["tool_choice"] = "auto";
  else if (type == "any") out["tool_choice"] = "required";
  else if (type == "none") out["tool_choice"] = "none";
  else if (type == "tool")
    out["tool_choice"] = {{"type", "function"},
                          {"function", {{"name", need_string(tc, "name", "tool_choice")}}}};
  else
    bad("tool_choice.type", "tool_choice.type must be auto, any, tool or none, got '" + type + "'");
  if (tc.contains("disable_parallel_tool_use") && !tc["disable_parallel_tool_use"].is_null()) {
    if (!tc["disable_parallel_tool_use"].is_boolean())
      bad("tool_choice.disable_parallel_tool_use",
          "tool_choice.disable_parallel_tool_use must be a boolean");
    out["parallel_tool_calls"] = !tc["disable_parallel_tool_use"].get<bool>();
  }
}

void translate_thinking(const ojson& t, ojson& out) {
  if (!t.is_object()) bad("thinking", "'thinking' must be an object with a 'type'");
  const std::string type = need_string(t, "type", "thinking");
  only_fields(t, {"type", "budget_tokens", "display"}, "thinking");
  ojson kwargs = ojson::object();
  if (type == "enabled") {
    const ojson& budget = need(t, "budget_tokens", "thinking");
    if (!budget.is_number_integer() || budget.get<int64_t>() < 1)
      bad("thinking.budget_tokens", "thinking.budget_tokens must be a positive integer");
    kwargs["enable_thinking"] = true;
    out["thinking_budget"] = budget;
  } else if (type == "adaptive") {
    kwargs["enable_thinking"] = true;
  } else if (type == "disabled") {
    kwargs["enable_thinking"] = false;
  } else {
    bad("thinking.type", "thinking.type must be enabled, adaptive or disabled, got '" + type + "'");
  }
  out["chat_template_kwargs"] = std::move(kwargs);
}

void translate_output_config(const ojson& oc, ojson& out) {
  if (!oc.is_object()) bad("output_config", "'output_config' must be an object");
  only_fields(oc, {"format", "effort"}, "output_config");
  if (oc.contains("effort") && !oc["effort"].is_null())
    bad("output_config.effort", "output_config.effort is not supported");
  if (!oc.contains("format") || oc["format"].is_null()) return;
  const ojson& f = oc["format"];
  if (!f.is_object() || f.value("type", "") != "json_schema")
    bad("output_config.format", "output_config.format must be {\"type\": \"json_schema\", ...}");
  only_fields(f, {"type", "schema"}, "output_config.format");
  const ojson& schema = need(f, "schema", "output_config.format");
  out["response_format"] = {{"type", "json_schema"},
                            {"json_schema", {{"name", "output"}, {"schema", schema}}}};
}

std::string tool_use_id(const json& call) {
  std::string id =
      call.contains("id") && call["id"].is_string() ? call["id"].get<std::string>() : "";
  if (id.rfind("toolu_", 0) == 0) return id;
  if (id.rfind("call_", 0) == 0) return "toolu_" + id.substr(5);
  if (!id.empty()) return "toolu_" + id;
  return "toolu_" + new_message_id().substr(4);
}

// An Anthropic stop_reason (and stop_sequence) for an OpenAI choice.
std::pair<std::string, json> stop_reason(const json& choice) {
  const std::string finish = choice.contains("finish_reason") && choice["finish_reason"].is_string()
                                 ? choice["finish_reason"].get<std::string>()
                                 : "stop";
  if (finish == "length") return {"max_tokens", nullptr};
  if (finish == "tool_calls") return {"tool_use", nullptr};
  if (finish == "content_filter") return {"refusal", nullptr};
  // vLLM's choices[].stop_reason: the stop string that ended the text, if one did.
  if (choice.contains("stop_reason") && choice["stop_reason"].is_string())
    return {"stop_sequence", choice["stop_reason"]};
  return {"end_turn", nullptr};
}

std::string nonempty_string(const json& obj, const char* key) {
  if (!obj.is_object() || !obj.contains(key) || !obj[key].is_string()) return "";
  return obj[key].get<std::string>();
}

}  // namespace

ojson to_openai_request(const ojson& body, bool count_tokens) {
  if (!body.is_object()) bad("", "request body must be a JSON object");
  // Fields that leave the output as it is (hints to Anthropic's own service) are accepted.
  static const std::set<std::string> kCreate = {
      "model",       "messages",      "max_tokens", "system",       "stop_sequences",
      "stream",      "temperature",   "top_p",      "top_k",        "tools",
      "tool_choice", "thinking",      "metadata",   "service_tier", "cache_control",
      "diagnostics", "inference_geo", "speed",      "output_config"};
  static const std::set<std::string> kCount = {"model",         "messages",     "system",
                                               "tools",         "tool_choice",  "thinking",
                                               "cache_control", "output_config"};
  only_fields(body, count_tokens ? kCount : kCreate, "");
  ojson out = ojson::object();
  if (body.contains("model")) out["model"] = body["model"];
  out["messages"] = translate_messages(body);
  if (body.contains("tools") && !body["tools"].is_null()) {
    ojson tools = translate_tools(body["tools"]);
    if (!tools.empty()) out["tools"] = std::move(tools);
  }
  if (body.contains("tool_choice") && !body["tool_choice"].is_null())
    translate_tool_choice(body["tool_choice"], out);
  if (body.contains("thinking") && !body["thinking"].is_null())
    translate_thinking(body["thinking"], out);
  if (body.contains("output_config") && !body["output_config"].is_null())
    translate_output_config(body["output_config"], out);
  if (count_tokens) return out;

  if (!body.contains("max_tokens") || body["max_tokens"].is_null())
    bad("max_tokens", "'max_tokens' is required");
  if (!body["max_tokens"].is_number_integer() || body["max_tokens"].get<int64_t>() < 1)
    bad("max_tokens", "'max_tokens' must be a positive integer");
  out["max_tokens"] = body["max_tokens"];
  for (const char* key : {"temperature", "top_p", "top_k"})
    if (body.contains(key) && !body[key].is_null()) out[key] = body[key];
  if (body.contains("stop_sequences") && !body["stop_sequences"].is_null()) {
    const ojson& stops = body["stop_sequences"];
    if (!stops.is_array() ||
        !std::all_of(stops.begin(), stops.end(), [](const ojson& s) { return s.is_string(); }))
      bad("stop_sequences", "'stop_sequences' must be an array of strings");
    if (!stops.empty()) out["stop"] = stops;
  }
  if (body.contains("metadata") && !body["metadata"].is_null() && !body["metadata"].is_object())
    bad("metadata", "'metadata' must be an object");
  if (body.contains("stream") && !body["stream"].is_null()) {
    if (!body["stream"].is_boolean()) bad("stream", "'stream' must be a boolean");
    if (body["stream"].get<bool>()) {
      out["stream"] = true;
      out["stream_options"] = {{"include_usage", true}};  // for message_delta's usage
    }
  }
  return out;
}

json from_openai_response(const json& completion, const std::string& id) {
  const json& choice = completion.at("choices").at(0);
  const json& msg = choice.at("message");
  json content = json::array();
  const std::string reasoning = nonempty_string(msg, "reasoning_content");
  if (!reasoning.empty())
    content.push_back({{"type", "thinking"}, {"thinking", reasoning}, {"signature", ""}});
  const std::string text = nonempty_string(msg, "content");
  if (!text.empty()) content.push_back({{"type", "text"}, {"text", text}});
  if (msg.contains("tool_calls") && msg["tool_calls"].is_array()) {
    for (const json& call : msg["tool_calls"]) {
      const json& fn = call.at("function");
      const std::string args = nonempty_string(fn, "arguments");
      json input = json::parse(args.empty() ? "{}" : args, nullptr, /*allow_exceptions=*/false);
      // Arguments that are not a JSON object are kept, not dropped.
      if (!input.is_object()) input = {{"arguments", args}};
      content.push_back({{"type", "tool_use"},
                         {"id", tool_use_id(call)},
                         {"name", nonempty_string(fn, "name")},
                         {"input", std::move(input)}});
    }
  }
  auto [reason, sequence] = stop_reason(choice);
  const json& usage = completion.at("usage");
  const int cached = cached_tokens(usage);
  return {{"id", id},
          {"type", "message"},
          {"role", "assistant"},
          {"model", completion.at("model")},
          {"content", std::move(content)},
          {"stop_reason", reason},
          {"stop_sequence", sequence},
          {"usage",
           {{"input_tokens", usage.at("prompt_tokens").get<int>() - cached},
            {"cache_creation_input_tokens", 0},
            {"cache_read_input_tokens", cached},
            {"output_tokens", usage.at("completion_tokens")}}}};
}

json error_body(const ApiError& e) {
  const char* type = "api_error";
  switch (e.status) {
    case 400: type = "invalid_request_error"; break;
    case 401: type = "authentication_error"; break;
    case 403: type = "permission_error"; break;
    case 404: type = "not_found_error"; break;
    case 413: type = "request_too_large"; break;
    case 429: type = "rate_limit_error"; break;
    case 503:
    case 529: type = "overloaded_error"; break;
    default: break;
  }
  return {{"type", "error"}, {"error", {{"type", type}, {"message", e.what()}}}};
}

std::string new_message_id() { return random_id("msg_", kIdLettersDigits); }

std::string Event::sse() const {
  return "event: " + name + "\ndata: " + data.dump(-1, ' ', false, json::error_handler_t::replace) +
         "\n\n";
}

StreamTranslator::StreamTranslator(std::string id, std::string model, int input_tokens)
    : id_(std::move(id)), model_(std::move(model)), input_tokens_(input_tokens) {}

std::vector<Event> StreamTranslator::start() {
  json message = {{"id", id_},
                  {"type", "message"},
                  {"role", "assistant"},
                  {"model", model_},
                  {"content", json::array()},
                  {"stop_reason", nullptr},
                  {"stop_sequence", nullptr},
                  {"usage", {{"input_tokens", input_tokens_}, {"output_tokens", 0}}}};
  return {{"message_start", {{"type", "message_start"}, {"message", std::move(message)}}},
          {"ping", {{"type", "ping"}}}};
}

void StreamTranslator::open(Block kind, json content_block, std::vector<Event>& out) {
  close(out);
  open_ = kind;
  ++index_;
  out.push_back({"content_block_start",
                 {{"type", "content_block_start"},
                  {"index", index_},
                  {"content_block", std::move(content_block)}}});
}

void StreamTranslator::close(std::vector<Event>& out) {
  if (open_ == Block::kNone) return;
  out.push_back({"content_block_stop", {{"type", "content_block_stop"}, {"index", index_}}});
  open_ = Block::kNone;
  open_tool_ = -1;
}

void StreamTranslator::delta(json d, std::vector<Event>& out) {
  out.push_back({"content_block_delta",
                 {{"type", "content_block_delta"}, {"index", index_}, {"delta", std::move(d)}}});
}

std::vector<Event> StreamTranslator::feed(const json& chunk) {
  std::vector<Event> out;
  if (errored_) return out;
  if (chunk.contains("error")) {
    const json& err = chunk["error"];
    const bool overloaded = nonempty_string(err, "code") == "shutting_down" ||
                            nonempty_string(err, "code") == "pending_timeout";
    const std::string message = nonempty_string(err, "message");
    out.push_back(
        {"error",
         {{"type", "error"},
          {"error",
           {{"type", overloaded ? "overloaded_error" : "api_error"}, {"message", message}}}}});
    errored_ = true;
    return out;
  }
  if (chunk.contains("usage") && chunk["usage"].is_object()) {
    const json& u = chunk["usage"];
    if (u.contains("completion_tokens") && u["completion_tokens"].is_number_integer())
      output_tokens_ = u["completion_tokens"].get<int>();
    cached_tokens_ = cached_tokens(u);
  }
  if (!chunk.contains("choices") || !chunk["choices"].is_array() || chunk["choices"].empty())
    return out;
  const json& choice = chunk["choices"][0];
  if (choice.contains("delta") && choice["delta"].is_object()) {
    const json& d = choice["delta"];
    const std::string reasoning = nonempty_string(d, "reasoning_content");
    if (!reasoning.empty()) {
      if (open_ != Block::kThinking)
        open(Block::kThinking, {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}, out);
      delta({{"type", "thinking_delta"}, {"thinking", reasoning}}, out);
    }
    const std::string text = nonempty_string(d, "content");
    if (!text.empty()) {
      if (open_ != Block::kText) open(Block::kText, {{"type", "text"}, {"text", ""}}, out);
      delta({{"type", "text_delta"}, {"text", text}}, out);
    }
    if (d.contains("tool_calls") && d["tool_calls"].is_array()) {
      for (const json& call : d["tool_calls"]) {
        const int index = call.contains("index") && call["index"].is_number_integer()
                              ? call["index"].get<int>()
                              : 0;
        const json fn = call.contains("function") ? call["function"] : json::object();
        if (open_ != Block::kToolUse || index != open_tool_) {
          open(Block::kToolUse,
               {{"type", "tool_use"},
                {"id", tool_use_id(call)},
                {"name", nonempty_string(fn, "name")},
                {"input", json::object()}},
               out);
          open_tool_ = index;
        }
        const std::string args = nonempty_string(fn, "arguments");
        if (!args.empty()) delta({{"type", "input_json_delta"}, {"partial_json", args}}, out);
      }
    }
  }
  if (choice.contains("finish_reason") && choice["finish_reason"].is_string()) {
    auto [reason, sequence] = stop_reason(choice);
    finish_reason_ = reason;
    stop_sequence_ = sequence.is_string() ? sequence.get<std::string>() : "";
  }
  return out;
}

std::vector<Event> StreamTranslator::finish() {
  std::vector<Event> out;
  if (errored_) return out;
  close(out);
  json delta = {{"stop_reason", finish_reason_.empty() ? "end_turn" : finish_reason_},
                {"stop_sequence", nullptr}};
  if (finish_reason_ == "stop_sequence") delta["stop_sequence"] = stop_sequence_;
  out.push_back({"message_delta",
                 {{"type", "message_delta"},
                  {"delta", std::move(delta)},
                  {"usage",
                   {{"input_tokens", input_tokens_ - cached_tokens_},
                    {"cache_creation_input_tokens", 0},
                    {"cache_read_input_tokens", cached_tokens_},
                    {"output_tokens", output_tokens_}}}}});
  out.push_back({"message_stop", {{"type", "message_stop"}}});
  return out;
}

}  // namespace ninfer::anthropic
