// OutputParser's tool-call modes (output_parser.h): where a call starts in the content,
// and each format's block read to its end and parsed — hermes (a JSON object in
// <tool_call>), qwen3_coder (<function=...><parameter=...> blocks, values converted by the
// tool's JSON schema) and llama3_json (JSON objects as the whole output, `;`-separated).
#include <algorithm>
#include <cctype>

#include "server/output_markers.h"
#include "server/output_parser.h"
#include "server/random_id.h"

namespace ninfer {

using namespace output_markers;  // NOLINT
using nlohmann::json;
using nlohmann::ordered_json;

namespace {

size_t skip_ws(std::string_view s, size_t p) {
  while (p < s.size() && (s[p] == ' ' || s[p] == '\t' || s[p] == '\r' || s[p] == '\n')) ++p;
  return p;
}

std::string_view trim(std::string_view s) {
  const size_t b = s.find_first_not_of(kWs);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(kWs) - b + 1);
}

// Reads `open` NAME `>` at body[p] (`<function=`, `<parameter=`), NAME trimmed into `name`;
// returns the position after the `>`, or npos when no such tag is there, or NAME is empty or
// holds a `<` or a newline.
size_t read_tag(std::string_view body, size_t p, std::string_view open, std::string& name) {
  if (!starts_with(body.substr(p), open)) return std::string_view::npos;
  const size_t gt = body.find('>', p + open.size());
  if (gt == std::string_view::npos) return std::string_view::npos;
  name = std::string(trim(body.substr(p + open.size(), gt - p - open.size())));
  if (name.empty() || name.find_first_of("<\n") != std::string::npos) return std::string_view::npos;
  return gt + 1;
}

std::string dump(const ordered_json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

// {"name": ..., "arguments" | "parameters": {...}} as (name, arguments text); false if
// `text` is not such an object. Arguments given as a string must hold a JSON object.
bool parse_json_call(std::string_view text, std::string& name, std::string& arguments) {
  const ordered_json j = ordered_json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return false;
  auto it = j.find("name");
  if (it == j.end() || !it->is_string() || it->get<std::string>().empty()) return false;
  name = it->get<std::string>();
  auto args = j.find("arguments");
  if (args == j.end()) args = j.find("parameters");
  if (args == j.end() || args->is_null()) {
    arguments = "{}";
    return true;
  }
  if (args->is_string()) {
    const std::string s = args->get<std::string>();
    const ordered_json inner = ordered_json::parse(s, nullptr, false);
    if (inner.is_discarded() || !inner.is_object()) return false;
    arguments = dump(inner);
    return true;
  }
  if (!args->is_object()) return false;
  arguments = dump(*args);
  return true;
}

// The JSON schema types a parameter allows ("type" as a string or a list, or anyOf /
// oneOf alternatives).
std::vector<std::string> schema_types(const json& schema) {
  std::vector<std::string> out;
  if (!schema.is_object()) return out;
  auto add = [&](const json& t) {
    if (t.is_string()) out.push_back(t.get<std::string>());
    else if (t.is_array())
      for (const auto& x : t)
        if (x.is_string()) out.push_back(x.get<std::string>());
  };
  if (schema.contains("type")) add(schema["type"]);
  for (const char* key : {"anyOf", "oneOf"})
    if (schema.contains(key) && schema[key].is_array())
      for (const auto& alt : schema[key])
        if (alt.is_object() && alt.contains("type")) add(alt["type"]);
  return out;
}

}  // namespace

void OutputParser::emit_call(std::string name, std::string arguments) {
  held_ws_.clear();
  if (opt_.max_tool_calls >= 0 && static_cast<int>(out_.tool_calls.size()) >= opt_.max_tool_calls)
    return;
  ToolCall call{random_id("call_", kIdLettersDigits), std::move(name), std::move(arguments)};
  delta_.tool_calls.push_back(
      {static_cast<int>(out_.tool_calls.size()), call.id, call.name, call.arguments});
  out_.tool_calls.push_back(std::move(call));
}

void OutputParser::pass_content(size_t n) {
  emit_content(std::string_view(buf_).substr(0, n));
  consume(n);
}

void OutputParser::begin_call(Mode mode) {
  mode_ = mode;
  scan_ = 0;
  in_string_ = escaped_ = false;
  depth_ = 0;
}

bool OutputParser::step_content(bool final) {
  const ToolCallFormat f = opt_.formats.tool_calls;
  if (f == ToolCallFormat::kNone) {
    pass_content(buf_.size());
    return false;
  }
  if (f == ToolCallFormat::kLlama3Json) {
    // Only an output that starts with a JSON object (or <|python_tag|>) is a call.
    const size_t i = buf_.find_first_not_of(kWs);
    pass_content(i == std::string::npos ? buf_.size() : i);
    if (buf_.empty()) return false;
    return start_json_call(0, final);
  }
  // hermes, qwen3_coder: a call starts at <tool_call> (or a bare <function=).
  const bool xml = f == ToolCallFormat::kQwen3Coder;
  size_t at = buf_.find(kToolOpen);
  if (xml) at = std::min(at, buf_.find(kFunctionOpen));
  if (at != std::string::npos) {
    pass_content(at);
    begin_call(xml ? Mode::kXmlCall : Mode::kHermesCall);
    return true;
  }
  const size_t keep = xml ? held_back(buf_, final, {kToolOpen, kFunctionOpen})
                          : held_back(buf_, final, {kToolOpen});
  pass_content(buf_.size() - keep);
  return false;
}

bool OutputParser::step_hermes(bool final) {
  // The block ends at the first </tool_call> outside a JSON string.
  scan_ = std::max(scan_, kToolOpen.size());
  size_t end = std::string::npos;
  while (scan_ < buf_.size()) {
    const char c = buf_[scan_];
    if (in_string_) {
      if (escaped_) escaped_ = false;
      else if (c == '\\') escaped_ = true;
      else if (c == '"' || c == '\n') in_string_ = false;  // a raw newline: not JSON anyway
      ++scan_;
      continue;
    }
    if (c == '"') {
      in_string_ = true;
    } else if (c == '<') {
      const std::string_view rest = std::string_view(buf_).substr(scan_);
      if (starts_with(rest, kToolClose)) {
        end = scan_;
        break;
      }
      if (is_partial(rest, kToolClose)) break;  // wait for the rest
    }
    ++scan_;
  }
  std::string name, args;
  if (end != std::string::npos) {
    const std::string_view inner =
        std::string_view(buf_).substr(kToolOpen.size(), end - kToolOpen.size());
    if (parse_json_call(inner, name, args)) emit_call(std::move(name), std::move(args));
    else emit_content(std::string_view(buf_).substr(0, end + kToolClose.size()));
    consume(end + kToolClose.size());
    mode_ = Mode::kContent;
    return true;
  }
  if (!final) return false;
  // Unclosed: a complete call still counts (the model ended right after it).
  if (parse_json_call(std::string_view(buf_).substr(kToolOpen.size()), name, args))
    emit_call(std::move(name), std::move(args));
  else emit_content(buf_);
  consume(buf_.size());
  mode_ = Mode::kContent;
  return false;
}

bool OutputParser::step_xml(bool final) {
  std::vector<std::pair<std::string, std::string>> calls;
  auto decide = [&](std::string_view body, size_t block_end) {
    if (parse_xml_calls(body, calls)) {
      for (auto& [name, args] : calls) emit_call(std::move(name), std::move(args));
    } else {
      emit_content(std::string_view(buf_).substr(0, block_end));
    }
    consume(block_end);
    mode_ = Mode::kContent;
  };
  if (starts_with(buf_, kToolOpen)) {
    // Ends at the first </tool_call> right after a </function> (whitespace between).
    size_t from = std::max(scan_, kToolOpen.size());
    for (;;) {
      const size_t q = buf_.find(kToolClose, from);
      if (q == std::string::npos) break;
      const size_t e = buf_.find_last_not_of(kWs, q - 1);
      if (e != std::string::npos && e + 1 >= kToolOpen.size() + kFunctionClose.size() &&
          buf_.compare(e + 1 - kFunctionClose.size(), kFunctionClose.size(), kFunctionClose) == 0) {
        decide(std::string_view(buf_).substr(kToolOpen.size(), q - kToolOpen.size()),
               q + kToolClose.size());
        return true;
      }
      from = q + 1;
    }
    const size_t tail = buf_.size() >= kToolClose.size() ? buf_.size() - kToolClose.size() + 1 : 0;
    scan_ = std::max(from, tail);
    if (!final) return false;
    decide(std::string_view(buf_).substr(kToolOpen.size()), buf_.size());
    return false;
  }
  // A bare <function=...>...</function>, maybe followed by a stray </tool_call>.
  const size_t f = buf_.find(kFunctionClose, std::max(scan_, kFunctionOpen.size()));
  if (f == std::string::npos) {
    scan_ = std::max(kFunctionOpen.size(), buf_.size() >= kFunctionClose.size()
                                               ? buf_.size() - kFunctionClose.size() + 1
                                               : size_t{0});
    if (!final) return false;
    decide(buf_, buf_.size());
    return false;
  }
  const size_t after = f + kFunctionClose.size();
  const size_t i = skip_ws(buf_, after);
  size_t block_end = after;
  const std::string_view rest = std::string_view(buf_).substr(i);
  if (starts_with(rest, kToolClose)) block_end = i + kToolClose.size();
  else if (!final && (rest.empty() || is_partial(rest, kToolClose))) return false;
  decide(std::string_view(buf_).substr(0, after), block_end);
  return true;
}

bool OutputParser::step_json(bool final) {
  auto fallback = [&] {  // not a call: this and everything after it is content
    emit_content(json_prefix_);
    json_prefix_.clear();
    mode_ = Mode::kPlain;
    return true;
  };
  if (scan_ == 0) {
    const size_t i = buf_.find_first_not_of(kWs);
    if (i == std::string::npos) {
      if (!final) return false;
      return fallback();
    }
    if (buf_[i] != '{') return fallback();
    json_prefix_ += buf_.substr(0, i);
    consume(i);
  }
  size_t end = std::string::npos;
  while (scan_ < buf_.size()) {
    const char c = buf_[scan_];
    if (in_string_) {
      if (c == '\n') return fallback();  // a raw newline in a string: not JSON
      if (escaped_) escaped_ = false;
      else if (c == '\\') escaped_ = true;
      else if (c == '"') in_string_ = false;
    } else if (scan_ > 0 && depth_ == 1 && c != ' ' && c != '\t' && c != '\r' && c != '\n' &&
               std::string_view(buf_).find_first_not_of(kWs, 1) == scan_ && c != '"' && c != '}') {
      return fallback();  // `{` and then no key: not an object
    } else if (c == '"') {
      in_string_ = true;
    } else if (c == '{' || c == '[') {
      ++depth_;
    } else if (c == '}' || c == ']') {
      if (--depth_ == 0) {
        end = scan_ + 1;
        break;
      }
    }
    ++scan_;
  }
  if (end == std::string::npos) {
    if (!final) return false;
    return fallback();
  }
  std::string name, args;
  if (!parse_json_call(std::string_view(buf_).substr(0, end), name, args)) return fallback();
  emit_call(std::move(name), std::move(args));
  json_prefix_.clear();
  consume(end);
  mode_ = Mode::kJsonBetween;
  return true;
}

bool OutputParser::parse_xml_calls(std::string_view body,
                                   std::vector<std::pair<std::string, std::string>>& out) const {
  out.clear();
  size_t p = 0;
  for (;;) {
    p = skip_ws(body, p);
    if (p == body.size()) return !out.empty();
    std::string name;
    size_t q = read_tag(body, p, kFunctionOpen, name);
    if (q == std::string_view::npos) return false;
    ordered_json args = ordered_json::object();
    for (;;) {
      q = skip_ws(body, q);
      if (starts_with(body.substr(q), kFunctionClose)) {
        q += kFunctionClose.size();
        break;
      }
      std::string param;
      size_t vstart = read_tag(body, q, kParameterOpen, param);
      if (vstart == std::string_view::npos) return false;
      if (vstart < body.size() && body[vstart] == '\n') ++vstart;
      // The value ends at a </parameter> followed by the next parameter or </function>
      // (a value may itself contain "</parameter>").
      size_t vend = std::string_view::npos;
      for (size_t from = vstart;;) {
        const size_t c = body.find(kParameterClose, from);
        if (c == std::string_view::npos) break;
        const std::string_view next = body.substr(skip_ws(body, c + kParameterClose.size()));
        if (starts_with(next, kParameterOpen) || starts_with(next, kFunctionClose)) {
          vend = c;
          break;
        }
        from = c + 1;
      }
      if (vend == std::string_view::npos) return false;
      std::string value(body.substr(vstart, vend - vstart));
      if (!value.empty() && value.back() == '\n') value.pop_back();
      args[param] = convert_parameter(name, param, value);
      q = vend + kParameterClose.size();
    }
    out.emplace_back(name, dump(args));
    p = q;
  }
}

ordered_json OutputParser::convert_parameter(const std::string& function, const std::string& param,
                                             const std::string& value) const {
  const json* schema = nullptr;
  if (opt_.tools.is_array()) {
    for (const auto& t : opt_.tools) {
      const json& fn = t.is_object() && t.contains("function") ? t["function"] : t;
      if (!fn.is_object() || fn.value("name", "") != function) continue;
      if (fn.contains("parameters") && fn["parameters"].is_object() &&
          fn["parameters"].contains("properties") && fn["parameters"]["properties"].is_object() &&
          fn["parameters"]["properties"].contains(param))
        schema = &fn["parameters"]["properties"][param];
      break;
    }
  }
  if (schema == nullptr) return value;  // not in the schema: as written
  const std::vector<std::string> types = schema_types(*schema);
  const bool nullable = std::find(types.begin(), types.end(), "null") != types.end();
  std::string type;
  for (const auto& t : types)
    if (t != "null") {
      type = t;
      break;
    }
  const std::string v(trim(value));
  if (nullable && (v == "null" || v == "None")) return nullptr;
  if (type.empty() || type == "string") return value;
  if (type == "boolean") {
    std::string lower = v;
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (lower == "true") return true;
    if (lower == "false") return false;
    return value;
  }
  const ordered_json parsed = ordered_json::parse(v, nullptr, false);
  if (parsed.is_discarded()) return value;
  if (v == "null") return nullptr;
  if (type == "integer" &&
      (parsed.is_number_integer() ||
       (parsed.is_number_float() &&
        parsed.get<double>() == static_cast<double>(static_cast<int64_t>(parsed.get<double>())))))
    return parsed.is_number_integer() ? parsed
                                      : ordered_json(static_cast<int64_t>(parsed.get<double>()));
  if (type == "number" && parsed.is_number()) return parsed;
  if (type == "object" && parsed.is_object()) return parsed;
  if (type == "array" && parsed.is_array()) return parsed;
  if (type != "integer" && type != "number" && type != "object" && type != "array") return parsed;
  return value;  // not of its type: left as the model wrote it
}

bool OutputParser::step_json_between(bool final) {
  // After a llama3_json call: `;` and the next call, or the rest is content.
  const size_t i = buf_.find_first_not_of(kWs);
  if (i == std::string::npos) {
    if (final) consume(buf_.size());
    return false;
  }
  if (buf_[i] == ';') {
    consume(i + 1);
    return true;
  }
  return start_json_call(i, final);
}

bool OutputParser::start_json_call(size_t i, bool final) {
  const std::string_view rest = std::string_view(buf_).substr(i);
  if (starts_with(rest, kPythonTag)) {
    consume(i + kPythonTag.size());
    json_prefix_ = std::string(kPythonTag);
  } else if (!final && is_partial(rest, kPythonTag)) {
    return false;
  } else if (rest[0] != '{') {
    consume(i);
    mode_ = Mode::kPlain;
    return true;
  }
  begin_call(Mode::kJsonCall);
  return true;
}

}  // namespace ninfer
