#include "structured/tool_grammar.h"

#include <stdexcept>
#include <vector>

namespace ninfer {

using json = nlohmann::ordered_json;

namespace {

// One format's call syntax around the arguments.
struct CallSyntax {
  std::string begin_prefix, begin_suffix;  // begin = prefix + NAME + suffix
  std::string end;
  std::string style;      // xgrammar's JSONSchemaFormat style of the arguments
  std::string separator;  // between calls
  bool single_call;       // the format carries one call per message
};

const CallSyntax* syntax(const std::string& format) {
  static const CallSyntax hermes{
      "<tool_call>\n{\"name\": \"", "\", \"arguments\": ", "}\n</tool_call>", "json", "\n", false};
  // The arguments' XML ends with the newline after its last </parameter> (a call without
  // arguments has none: "<function=NAME>\n</function>").
  static const CallSyntax qwen3_coder{
      "<tool_call>\n<function=", ">\n", "</function>\n</tool_call>", "qwen_xml", "\n", false};
  static const CallSyntax llama3_json{
      "{\"name\": \"", "\", \"parameters\": ", "}", "json", "", true};
  if (format == "hermes") return &hermes;
  if (format == "qwen3_coder") return &qwen3_coder;
  if (format == "llama3_json") return &llama3_json;
  return nullptr;
}

// A function name inside a JSON string (the name as the template writes it).
std::string json_string_body(const std::string& s) {
  const std::string quoted = json(s).dump();
  return quoted.substr(1, quoted.size() - 2);
}

json call_tag(const CallSyntax& syn, const json& function) {
  const std::string name = function.at("name").get<std::string>();
  json params = function.contains("parameters") && !function["parameters"].is_null()
                    ? function["parameters"]
                    : json{{"type", "object"}, {"properties", json::object()}};
  const std::string shown = syn.style == "json" ? json_string_body(name) : name;
  // At most one blank in a row inside the arguments: the spacing templates render
  // (tojson), without the endless whitespace a weak model falls into otherwise.
  return {{"type", "tag"},
          {"begin", syn.begin_prefix + shown + syn.begin_suffix},
          {"content",
           {{"type", "json_schema"},
            {"json_schema", params},
            {"style", syn.style},
            {"max_whitespace_cnt", 1}}},
          {"end", syn.end}};
}

// The tools as {name -> function}, checked.
std::vector<json> functions_of(const json& tools) {
  if (!tools.is_array() || tools.empty())
    throw std::invalid_argument("tool_choice requires a non-empty 'tools' array");
  std::vector<json> out;
  for (size_t i = 0; i < tools.size(); ++i) {
    const json& t = tools[i];
    const std::string p = "tools[" + std::to_string(i) + "]";
    if (!t.is_object() || t.value("type", "function") != "function" || !t.contains("function") ||
        !t["function"].is_object())
      throw std::invalid_argument(p + " must be {\"type\": \"function\", \"function\": {...}}");
    const json& f = t["function"];
    if (!f.contains("name") || !f["name"].is_string() || f["name"].get<std::string>().empty())
      throw std::invalid_argument(p + ".function.name must be a non-empty string");
    if (f.contains("parameters") && !f["parameters"].is_null() && !f["parameters"].is_object() &&
        !f["parameters"].is_boolean())
      throw std::invalid_argument(p + ".function.parameters must be a JSON schema object");
    out.push_back(f);
  }
  return out;
}

json with_reasoning(json format, ToolReasoning reasoning) {
  if (reasoning == ToolReasoning::kNone) return format;
  json think_text = {{"type", "any_text"}};
  json block =
      reasoning == ToolReasoning::kThinkBlock
          ? json{{"type", "tag"},
                 {"begin", "<think>"},
                 {"content", think_text},
                 {"end", "</think>"}}
          : json{{"type", "tag"}, {"begin", ""}, {"content", think_text}, {"end", "</think>"}};
  return {{"type", "sequence"},
          {"elements",
           json::array({block, {{"type", "const_string"}, {"value", "\n\n"}}, std::move(format)})}};
}

}  // namespace

bool is_tool_call_format(const std::string& format) { return syntax(format) != nullptr; }

std::string tool_call_structural_tag(const std::string& format, const json& tools,
                                     const json& tool_choice, ToolReasoning reasoning) {
  const CallSyntax* syn = syntax(format);
  if (!syn)
    throw std::invalid_argument("unknown tool-call format '" + format +
                                "' (known: hermes, qwen3_coder, llama3_json)");
  if (tool_choice.is_null()) return "";
  json format_json;
  if (tool_choice.is_string()) {
    const std::string choice = tool_choice.get<std::string>();
    if (choice == "auto" || choice == "none") return "";
    if (choice != "required")
      throw std::invalid_argument(
          "tool_choice must be \"none\", \"auto\", \"required\" or "
          "{\"type\": \"function\", \"function\": {\"name\": ...}}, got \"" +
          choice + "\"");
    json tags = json::array();
    for (const json& f : functions_of(tools)) tags.push_back(call_tag(*syn, f));
    format_json = {{"type", "tags_with_separator"},
                   {"tags", tags},
                   {"separator", syn->separator},
                   {"at_least_one", true},
                   {"stop_after_first", syn->single_call}};
  } else {
    if (!tool_choice.is_object() || tool_choice.value("type", "") != "function" ||
        !tool_choice.contains("function") || !tool_choice["function"].is_object() ||
        !tool_choice["function"].contains("name") || !tool_choice["function"]["name"].is_string())
      throw std::invalid_argument(
          "a named tool_choice must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
    const std::string name = tool_choice["function"]["name"].get<std::string>();
    const std::vector<json> functions = functions_of(tools);
    const json* match = nullptr;
    for (const json& f : functions)
      if (f["name"].get<std::string>() == name) match = &f;
    if (!match)
      throw std::invalid_argument("tool_choice names the function '" + name +
                                  "', which is not among the request's tools");
    format_json = call_tag(*syn, *match);
  }
  return json{{"type", "structural_tag"}, {"format", with_reasoning(format_json, reasoning)}}
      .dump();
}

std::shared_ptr<TokenConstraint> make_tool_call_constraint(const GrammarCompiler& compiler,
                                                           const std::string& format,
                                                           const json& tools,
                                                           const json& tool_choice,
                                                           ToolReasoning reasoning) {
  const std::string tag = tool_call_structural_tag(format, tools, tool_choice, reasoning);
  if (tag.empty()) return nullptr;
  return compiler.constraint({GrammarSpec::Kind::kStructuralTag, tag});
}

}  // namespace ninfer
