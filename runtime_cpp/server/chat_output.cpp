#include "server/chat_output.h"

#include <algorithm>

#include "server/api.h"
#include "server/thinking_budget.h"

namespace ninfer {

using nlohmann::json;

namespace {

[[noreturn]] void bad(const std::string& param, const std::string& msg) {
  throw ApiError(400, msg, "invalid_request_error", param);
}

bool flag(const json& body, const char* key, bool dflt) {
  if (!body.contains(key) || body[key].is_null()) return dflt;
  if (!body[key].is_boolean()) bad(key, std::string("'") + key + "' must be a boolean");
  return body[key].get<bool>();
}

void parse_tools(const json& body, CompletionRequest& r) {
  if (!body.contains("tools") || body["tools"].is_null()) return;
  const json& tools = body["tools"];
  if (!tools.is_array()) bad("tools", "'tools' must be an array");
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string p = "tools[" + std::to_string(i) + "]";
    const json& t = tools[i];
    if (!t.is_object() || t.value("type", "") != "function" || !t.contains("function") ||
        !t["function"].is_object() || !t["function"].contains("name") ||
        !t["function"]["name"].is_string())
      bad(p, p + " must be {\"type\": \"function\", \"function\": {\"name\": ..., ...}}");
  }
}

void parse_tool_choice(const json& body, CompletionRequest& r) {
  if (!body.contains("tool_choice") || body["tool_choice"].is_null()) return;
  const json& c = body["tool_choice"];
  const bool has_tools = r.tools.is_array() && !r.tools.empty();
  if (c.is_string()) {
    const std::string s = c.get<std::string>();
    if (s != "none" && s != "auto" && s != "required")
      bad("tool_choice", "'tool_choice' must be 'none', 'auto', 'required' or a named function");
    if (s != "none" && !has_tools)
      bad("tool_choice", "'tool_choice' is only allowed when 'tools' are given");
  } else if (c.is_object()) {
    if (c.value("type", "") != "function" || !c.contains("function") ||
        !c["function"].is_object() || !c["function"].contains("name") ||
        !c["function"]["name"].is_string())
      bad("tool_choice",
          "'tool_choice' must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
    if (!has_tools) bad("tool_choice", "'tool_choice' is only allowed when 'tools' are given");
  } else {
    bad("tool_choice", "'tool_choice' must be a string or an object");
  }
}

}  // namespace

void parse_output_request(const json& body, CompletionRequest& r) {
  parse_tools(body, r);
  parse_tool_choice(body, r);
  OutputRequest& o = r.output;
  o.parallel_tool_calls = flag(body, "parallel_tool_calls", true);
  o.include_reasoning = flag(body, "include_reasoning", true);
  if (body.contains("reasoning_effort") && !body["reasoning_effort"].is_null()) {
    const json& e = body["reasoning_effort"];
    static const char* kEfforts[] = {"none", "minimal", "low", "medium", "high"};
    if (!e.is_string() || std::none_of(std::begin(kEfforts), std::end(kEfforts),
                                       [&](const char* x) { return e.get<std::string>() == x; }))
      bad("reasoning_effort",
          "'reasoning_effort' must be one of 'none', 'minimal', 'low', 'medium', 'high'");
    o.reasoning_effort = e.get<std::string>();
    nlohmann::ordered_json& kw = r.chat_template_kwargs;
    if (!kw.is_object()) kw = nlohmann::ordered_json::object();
    if (o.reasoning_effort == "none") {
      if (!kw.contains("enable_thinking")) kw["enable_thinking"] = false;
    } else if (!kw.contains("reasoning_effort")) {
      kw["reasoning_effort"] = o.reasoning_effort;
    }
  }
  for (const char* key : {"thinking_budget", "thinking_token_budget"}) {
    if (!body.contains(key) || body[key].is_null()) continue;
    const json& v = body[key];
    if (!v.is_number_integer() || v.get<int64_t>() < -1 || v.get<int64_t>() > (1 << 30))
      bad(key, std::string("'") + key + "' must be an integer >= -1 (-1: unlimited)");
    const int n = static_cast<int>(v.get<int64_t>());
    if (o.thinking_budget && *o.thinking_budget != n)
      bad(key, "'thinking_budget' and 'thinking_token_budget' disagree");
    o.thinking_budget = n;
  }
}

namespace {

OutputParserOptions parser_options(const OutputConfig& config, const CompletionRequest& r) {
  OutputParserOptions o;
  o.formats = config.parsers;
  const bool no_tools = !r.tools.is_array() || r.tools.empty() ||
                        (r.tool_choice.is_string() && r.tool_choice.get<std::string>() == "none");
  if (no_tools) o.formats.tool_calls = ToolCallFormat::kNone;
  o.tools = r.tools.is_null() ? json() : json::parse(r.tools.dump());
  o.max_tool_calls = r.output.parallel_tool_calls ? -1 : 1;
  return o;
}

}  // namespace

ChatOutput::ChatOutput(const OutputConfig& config, const CompletionRequest& r,
                       std::string_view prompt, const Tokenizer& tok)
    : tok_(tok), reasoning_(config.parsers.reasoning != ReasoningFormat::kNone),
      include_reasoning_(r.output.include_reasoning), parser_(parser_options(config, r), prompt) {
  const std::optional<int>& asked = r.output.thinking_budget;
  if (asked && *asked >= 0 && !reasoning_)
    bad("thinking_budget",
        "'thinking_budget' needs a reasoning model: this server has no reasoning parser "
        "(--reasoning-parser)");
  const int budget = asked ? *asked : config.reasoning_budget;
  const ReasoningStart start = reasoning_start(config.parsers.reasoning, prompt);
  if (budget >= 0 && (start == ReasoningStart::kInside || start == ReasoningStart::kMaybe))
    budget_ = std::make_shared<ThinkingBudget>(tok, budget, start);
}

std::vector<json> ChatOutput::deltas(const OutputDelta& d) const {
  std::vector<json> out;
  json text = json::object();
  if (include_reasoning_ && !d.reasoning.empty()) text["reasoning_content"] = d.reasoning;
  if (!d.content.empty()) text["content"] = d.content;
  if (!text.empty()) out.push_back(std::move(text));
  // As OpenAI streams a call: id, type and name with empty arguments, then the arguments.
  for (const ToolCallDelta& c : d.tool_calls) {
    if (!c.id.empty())
      out.push_back(
          {{"tool_calls", json::array({{{"index", c.index},
                                        {"id", c.id},
                                        {"type", "function"},
                                        {"function", {{"name", c.name}, {"arguments", ""}}}}})}});
    if (!c.arguments.empty())
      out.push_back({{"tool_calls", json::array({{{"index", c.index},
                                                  {"function", {{"arguments", c.arguments}}}}})}});
  }
  return out;
}

std::vector<json> ChatOutput::on_text(const std::string& text, const std::vector<int32_t>& tokens) {
  tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
  return deltas(parser_.feed(text));
}

std::vector<json> ChatOutput::on_done() { return deltas(parser_.finish()); }

std::string ChatOutput::finish_reason(const std::string& engine_reason) const {
  return engine_reason == "stop" && !parser_.parsed().tool_calls.empty() ? "tool_calls"
                                                                         : engine_reason;
}

json ChatOutput::message() const {
  const ParsedOutput& p = parser_.parsed();
  json m = {{"role", "assistant"}};
  m["content"] = p.content.empty() && !p.tool_calls.empty() ? json(nullptr) : json(p.content);
  if (include_reasoning_ && !p.reasoning.empty()) m["reasoning_content"] = p.reasoning;
  if (!p.tool_calls.empty()) {
    json calls = json::array();
    for (const ToolCall& c : p.tool_calls)
      calls.push_back({{"id", c.id},
                       {"type", "function"},
                       {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
    m["tool_calls"] = std::move(calls);
  }
  return m;
}

void ChatOutput::add_usage(json& usage) const {
  if (!reasoning_) return;
  usage["completion_tokens_details"] = {
      {"reasoning_tokens", count_reasoning_tokens(tok_, tokens_, parser_.reasoning_span())}};
}

}  // namespace ninfer
