#include "server/structured_output.h"

#include <stdexcept>
#include <utility>
#include <vector>

namespace ninfer {

using json = nlohmann::ordered_json;  // schemas keep their key order

namespace {

[[noreturn]] void bad(const std::string& param, const std::string& msg) {
  throw ApiError(400, msg, "invalid_request_error", param);
}

template <class Json>
bool present(const Json& obj, const char* key) {
  return obj.contains(key) && !obj[key].is_null();
}

// A JSON schema given as an object (or a boolean schema) or as its text.
std::string schema_text(const json& v, const std::string& param) {
  if (v.is_object() || v.is_boolean()) return v.dump();
  if (v.is_string()) return v.get<std::string>();
  bad(param, "'" + param + "' must be a JSON schema (an object, or its text)");
}

std::string string_field(const json& v, const std::string& param) {
  if (!v.is_string()) bad(param, "'" + param + "' must be a string");
  return v.get<std::string>();
}

GrammarSpec choice_spec(const json& v, const std::string& param) {
  if (!v.is_array() || v.empty())
    bad(param, "'" + param + "' must be a non-empty array of strings");
  std::vector<std::string> choices;
  for (const json& c : v) {
    if (!c.is_string() || c.get<std::string>().empty())
      bad(param, "'" + param + "' entries must be non-empty strings");
    choices.push_back(c.get<std::string>());
  }
  return GrammarSpec::choice(choices);
}

// vLLM's grammar field holds an EBNF (GBNF) grammar or a Lark one; EBNF rules use "::=".
GrammarSpec grammar_spec(const json& v, const std::string& param) {
  std::string text = string_field(v, param);
  const bool ebnf = text.find("::=") != std::string::npos;
  return {ebnf ? GrammarSpec::Kind::kEbnf : GrammarSpec::Kind::kLark, std::move(text)};
}

GrammarSpec structural_tag_spec(const json& v, const std::string& param) {
  json tag = v.is_string() ? json::parse(v.get<std::string>(), nullptr, false) : v;
  if (tag.is_discarded() || !tag.is_object())
    bad(param, "'" + param + "' must be a structural tag object (or its JSON text)");
  if (!tag.contains("format"))
    bad(param, "'" + param +
                   "': only structural tags with a 'format' are supported (the legacy "
                   "'structures' / 'triggers' form is not)");
  json full = {{"type", "structural_tag"}, {"format", tag["format"]}};
  return {GrammarSpec::Kind::kStructuralTag, full.dump()};
}

struct Found {
  std::string param;
  GrammarSpec spec;
};

void response_format(const json& body, std::vector<Found>& found) {
  if (!present(body, "response_format")) return;
  const json& rf = body["response_format"];
  if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string())
    bad("response_format", "'response_format' must be an object with a string 'type'");
  const std::string type = rf["type"].get<std::string>();
  if (type == "text") return;
  if (type == "json_object") {
    found.push_back({"response_format", {GrammarSpec::Kind::kJsonObject, ""}});
  } else if (type == "json_schema") {
    const std::string p = "response_format.json_schema";
    if (!present(rf, "json_schema") || !rf["json_schema"].is_object())
      bad(p, "'" + p + "' is required for type json_schema: {\"name\", \"schema\", ...}");
    const json& js = rf["json_schema"];
    for (const auto& [key, value] : js.items()) {
      if (key == "name" || key == "description") {
        if (!value.is_null() && !value.is_string()) bad(p + "." + key, "must be a string");
      } else if (key == "strict") {
        // Strict or not, the output follows the schema: xgrammar enforces it exactly.
        if (!value.is_null() && !value.is_boolean()) bad(p + ".strict", "must be a boolean");
      } else if (key != "schema") {
        bad(p + "." + key, "'" + p + "." + key + "' is not supported");
      }
    }
    if (!present(js, "schema")) bad(p + ".schema", "'" + p + ".schema' is required");
    found.push_back(
        {"response_format", {GrammarSpec::Kind::kJsonSchema, schema_text(js["schema"], p)}});
  } else if (type == "structural_tag") {
    found.push_back({"response_format", structural_tag_spec(rf, "response_format")});
  } else {
    bad("response_format.type",
        "response_format type '" + type +
            "' is not supported (supported: text, json_object, json_schema, structural_tag)");
  }
}

void structured_outputs(const json& body, std::vector<Found>& found) {
  if (!present(body, "structured_outputs")) return;
  const json& so = body["structured_outputs"];
  if (!so.is_object()) bad("structured_outputs", "'structured_outputs' must be an object");
  // Free whitespace only when asked for (vLLM allows it unless disable_any_whitespace):
  // see GrammarSpec::any_whitespace.
  bool any_whitespace = false;
  std::vector<Found> here;
  for (const auto& [key, value] : so.items()) {
    const std::string p = "structured_outputs." + key;
    if (value.is_null()) continue;
    if (key == "json") {
      here.push_back({p, {GrammarSpec::Kind::kJsonSchema, schema_text(value, p)}});
    } else if (key == "regex") {
      here.push_back({p, {GrammarSpec::Kind::kRegex, string_field(value, p)}});
    } else if (key == "choice") {
      here.push_back({p, choice_spec(value, p)});
    } else if (key == "grammar") {
      here.push_back({p, grammar_spec(value, p)});
    } else if (key == "json_object") {
      if (!value.is_boolean()) bad(p, "'" + p + "' must be a boolean");
      if (value.get<bool>()) here.push_back({p, {GrammarSpec::Kind::kJsonObject, ""}});
    } else if (key == "structural_tag") {
      here.push_back({p, structural_tag_spec(value, p)});
    } else if (key == "disable_any_whitespace") {
      if (!value.is_boolean()) bad(p, "'" + p + "' must be a boolean");
      any_whitespace = !value.get<bool>();
    } else if (key == "disable_fallback") {
      // One grammar engine, nothing to fall back to: either value means the same.
      if (!value.is_boolean()) bad(p, "'" + p + "' must be a boolean");
    } else {
      bad(p, "'" + p + "' is not supported");
    }
  }
  for (Found& f : here) {
    f.spec.any_whitespace = any_whitespace;
    found.push_back(std::move(f));
  }
}

void guided_fields(const json& body, std::vector<Found>& found) {
  if (present(body, "guided_json"))
    found.push_back(
        {"guided_json",
         {GrammarSpec::Kind::kJsonSchema, schema_text(body["guided_json"], "guided_json")}});
  if (present(body, "guided_regex"))
    found.push_back(
        {"guided_regex",
         {GrammarSpec::Kind::kRegex, string_field(body["guided_regex"], "guided_regex")}});
  if (present(body, "guided_choice"))
    found.push_back({"guided_choice", choice_spec(body["guided_choice"], "guided_choice")});
  if (present(body, "guided_grammar"))
    found.push_back({"guided_grammar", grammar_spec(body["guided_grammar"], "guided_grammar")});
  for (const char* key : {"guided_whitespace_pattern", "guided_decoding_backend"})
    if (present(body, key)) bad(key, std::string("'") + key + "' is not supported");
}

}  // namespace

void parse_structured_output(const nlohmann::json& unordered, const std::string& body_text,
                             CompletionRequest& r) {
  static const char* const kFields[] = {"response_format",
                                        "structured_outputs",
                                        "guided_json",
                                        "guided_regex",
                                        "guided_choice",
                                        "guided_grammar",
                                        "guided_whitespace_pattern",
                                        "guided_decoding_backend"};
  bool any = false;
  for (const char* key : kFields) any = any || present(unordered, key);
  if (!any) return;  // the common case: no second parse
  const json body = json::parse(body_text);
  std::vector<Found> found;
  response_format(body, found);
  structured_outputs(body, found);
  guided_fields(body, found);
  if (found.size() > 1)
    bad(found[1].param, "only one output constraint may be given per request; got '" +
                            found[0].param + "' and '" + found[1].param + "'");
  if (found.empty()) return;
  r.grammar = std::move(found[0].spec);
  r.grammar_param = std::move(found[0].param);
}

TokenConstraints structured_output_constraints(const CompletionRequest& r,
                                               const GrammarCompiler* compiler,
                                               const Tokenizer& tok, ToolReasoning reasoning) {
  if (!r.grammar) return {};
  if (!compiler)
    throw ApiError(400, "structured output is not available on this server",
                   "invalid_request_error", r.grammar_param);
  try {
    std::shared_ptr<TokenConstraint> c = compiler->constraint(*r.grammar);
    if (reasoning != ToolReasoning::kNone)
      c = std::make_shared<ReasoningGate>(std::move(c), tok, reasoning);
    return {std::move(c)};
  } catch (const GrammarError& e) {
    throw ApiError(400, "'" + r.grammar_param + "' was rejected by the grammar engine: " + e.what(),
                   "invalid_request_error", r.grammar_param);
  }
}

TokenConstraints tool_choice_constraints(const GrammarCompiler& compiler, const std::string& format,
                                         const json& tools, const json& tool_choice,
                                         ToolReasoning reasoning) {
  if (tool_choice.is_null()) return {};
  std::shared_ptr<TokenConstraint> c;
  try {
    c = make_tool_call_constraint(compiler, format, tools, tool_choice, reasoning);
  } catch (const std::invalid_argument& e) {
    throw ApiError(400, e.what(), "invalid_request_error", "tool_choice");
  } catch (const GrammarError& e) {
    throw ApiError(
        400, std::string("a tool's parameters were rejected by the grammar engine: ") + e.what(),
        "invalid_request_error", "tools");
  }
  if (!c) return {};
  return {c};
}

}  // namespace ninfer
