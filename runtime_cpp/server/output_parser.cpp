#include "server/output_parser.h"

#include <algorithm>
#include <cctype>
#include <random>
#include <stdexcept>

#include "text/tokenizer.h"

namespace ninfer {

using nlohmann::json;
using nlohmann::ordered_json;

namespace {

constexpr const char* kWs = " \t\r\n";
constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kToolOpen = "<tool_call>";
constexpr std::string_view kToolClose = "</tool_call>";
constexpr std::string_view kFunctionOpen = "<function=";
constexpr std::string_view kFunctionClose = "</function>";
constexpr std::string_view kParameterOpen = "<parameter=";
constexpr std::string_view kParameterClose = "</parameter>";
constexpr std::string_view kPythonTag = "<|python_tag|>";

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
}

// `s` is a proper prefix of `marker` (more text could complete it).
bool is_partial(std::string_view s, std::string_view marker) {
  return s.size() < marker.size() && marker.compare(0, s.size(), s) == 0;
}

// The longest suffix of `s` that is a proper prefix of `marker`.
size_t partial_suffix(std::string_view s, std::string_view marker) {
  for (size_t k = std::min(s.size(), marker.size() - 1); k > 0; --k)
    if (s.compare(s.size() - k, k, marker, 0, k) == 0) return k;
  return 0;
}

size_t skip_ws(std::string_view s, size_t p) {
  while (p < s.size() && (s[p] == ' ' || s[p] == '\t' || s[p] == '\r' || s[p] == '\n')) ++p;
  return p;
}

std::string_view trim(std::string_view s) {
  const size_t b = s.find_first_not_of(kWs);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(kWs) - b + 1);
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

std::string new_call_id() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += alphabet[rng() % 62];
  return id;
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

const char* const kReasoningFormatNames = "none, think";
const char* const kToolCallFormatNames = "none, hermes, qwen3_coder, llama3_json";

const char* format_name(ReasoningFormat f) {
  return f == ReasoningFormat::kThink ? "think" : "none";
}

const char* format_name(ToolCallFormat f) {
  switch (f) {
    case ToolCallFormat::kHermes: return "hermes";
    case ToolCallFormat::kQwen3Coder: return "qwen3_coder";
    case ToolCallFormat::kLlama3Json: return "llama3_json";
    case ToolCallFormat::kNone: break;
  }
  return "none";
}

ReasoningFormat parse_reasoning_format(const std::string& name) {
  if (name == "none") return ReasoningFormat::kNone;
  if (name == "think" || name == "qwen3" || name == "deepseek_r1") return ReasoningFormat::kThink;
  throw std::invalid_argument("unknown reasoning parser '" + name +
                              "' (known: " + kReasoningFormatNames + ")");
}

ToolCallFormat parse_tool_call_format(const std::string& name) {
  if (name == "none") return ToolCallFormat::kNone;
  if (name == "hermes") return ToolCallFormat::kHermes;
  if (name == "qwen3_coder") return ToolCallFormat::kQwen3Coder;
  if (name == "llama3_json") return ToolCallFormat::kLlama3Json;
  throw std::invalid_argument("unknown tool-call parser '" + name +
                              "' (known: " + kToolCallFormatNames + ")");
}

ReasoningStart reasoning_start(ReasoningFormat f, std::string_view prompt) {
  if (f == ReasoningFormat::kNone) return ReasoningStart::kNone;
  const size_t open = prompt.rfind(kThinkOpen), close = prompt.rfind(kThinkClose);
  if (open != std::string_view::npos && (close == std::string_view::npos || close < open))
    return ReasoningStart::kInside;
  if (close != std::string_view::npos &&
      prompt.find_first_not_of(kWs, close + kThinkClose.size()) == std::string_view::npos)
    return ReasoningStart::kClosed;
  return ReasoningStart::kMaybe;
}

OutputParser::OutputParser(OutputParserOptions options, std::string_view prompt)
    : opt_(std::move(options)), mode_(Mode::kContent) {
  switch (reasoning_start(opt_.formats.reasoning, prompt)) {
    case ReasoningStart::kInside: mode_ = Mode::kReasoning; break;
    case ReasoningStart::kMaybe: mode_ = Mode::kStart; break;
    case ReasoningStart::kNone:
    case ReasoningStart::kClosed: break;
  }
}

std::pair<size_t, size_t> OutputParser::reasoning_span() const { return {r_begin_, r_end_}; }

OutputDelta OutputParser::feed(std::string_view text) {
  buf_.append(text);
  while (step(false)) {
  }
  return std::exchange(delta_, OutputDelta{});
}

OutputDelta OutputParser::finish() {
  while (step(true)) {
  }
  if (out_.tool_calls.empty() && !held_ws_.empty()) {  // trailing whitespace of the answer
    out_.content += held_ws_;
    delta_.content += held_ws_;
  }
  held_ws_.clear();
  return std::exchange(delta_, OutputDelta{});
}

void OutputParser::consume(size_t n) {
  buf_.erase(0, n);
  consumed_ += n;
}

void OutputParser::emit_reasoning(std::string_view text) {
  if (!reasoning_text_) {
    const size_t b = text.find_first_not_of(kWs);
    if (b == std::string_view::npos) return;
    text.remove_prefix(b);
  }
  const size_t e = text.find_last_not_of(kWs);
  if (e == std::string_view::npos) {  // whitespace only: it may be the block's last
    held_ws_.append(text);
    return;
  }
  const std::string piece = held_ws_ + std::string(text.substr(0, e + 1));
  held_ws_ = std::string(text.substr(e + 1));
  reasoning_text_ = true;
  out_.reasoning += piece;
  delta_.reasoning += piece;
}

void OutputParser::emit_content(std::string_view text) {
  if (text.empty()) return;
  if (opt_.formats.tool_calls == ToolCallFormat::kNone) {
    out_.content.append(text);
    delta_.content.append(text);
    return;
  }
  // Whitespace is held until text follows: whitespace around tool calls is neither, and
  // an answer that starts after a call starts at its text.
  if (out_.content.empty() && !out_.tool_calls.empty()) {
    const size_t b = text.find_first_not_of(kWs);
    if (b == std::string_view::npos) return;
    text.remove_prefix(b);
    held_ws_.clear();
  }
  const size_t e = text.find_last_not_of(kWs);
  if (e == std::string_view::npos) {
    held_ws_.append(text);
    return;
  }
  const std::string piece = held_ws_ + std::string(text.substr(0, e + 1));
  held_ws_ = std::string(text.substr(e + 1));
  out_.content += piece;
  delta_.content += piece;
}

void OutputParser::emit_call(std::string name, std::string arguments) {
  held_ws_.clear();
  if (opt_.max_tool_calls >= 0 && static_cast<int>(out_.tool_calls.size()) >= opt_.max_tool_calls)
    return;
  ToolCall call{new_call_id(), std::move(name), std::move(arguments)};
  delta_.tool_calls.push_back(
      {static_cast<int>(out_.tool_calls.size()), call.id, call.name, call.arguments});
  out_.tool_calls.push_back(std::move(call));
}

bool OutputParser::step(bool final) {
  if (buf_.empty() && !final) return false;
  switch (mode_) {
    case Mode::kStart: {
      const size_t i = buf_.find_first_not_of(kWs);
      if (i == std::string::npos) {
        if (!final) return false;
        mode_ = Mode::kContent;
        return true;
      }
      const std::string_view rest = std::string_view(buf_).substr(i);
      if (starts_with(rest, kThinkOpen)) {
        r_begin_ = r_end_ = consumed_ + i + kThinkOpen.size();
        consume(i + kThinkOpen.size());
        mode_ = Mode::kReasoning;
        return true;
      }
      if (!final && is_partial(rest, kThinkOpen)) return false;
      mode_ = Mode::kContent;
      return true;
    }
    case Mode::kReasoning: {
      const size_t p = buf_.find(kThinkClose);
      if (p != std::string::npos) {
        emit_reasoning(std::string_view(buf_).substr(0, p));
        r_end_ = consumed_ + p;
        consume(p + kThinkClose.size());
        held_ws_.clear();
        mode_ = Mode::kAfterReasoning;
        return true;
      }
      const size_t keep = final ? 0 : partial_suffix(buf_, kThinkClose);
      emit_reasoning(std::string_view(buf_).substr(0, buf_.size() - keep));
      consume(buf_.size() - keep);
      r_end_ = consumed_;
      if (final) held_ws_.clear();
      return false;
    }
    case Mode::kAfterReasoning: {
      const size_t i = buf_.find_first_not_of(kWs);
      if (i == std::string::npos) {
        consume(buf_.size());
        return false;
      }
      consume(i);
      mode_ = Mode::kContent;
      return true;
    }
    case Mode::kContent: return step_content(final);
    case Mode::kHermesCall: return step_hermes(final);
    case Mode::kXmlCall: return step_xml(final);
    case Mode::kJsonCall: return step_json(final);
    case Mode::kJsonBetween: {
      const size_t i = buf_.find_first_not_of(kWs);
      if (i == std::string::npos) {
        if (final) consume(buf_.size());
        return false;
      }
      const std::string_view rest = std::string_view(buf_).substr(i);
      if (rest[0] == ';') {
        consume(i + 1);
        return true;
      }
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
      mode_ = Mode::kJsonCall;
      scan_ = 0;
      in_string_ = escaped_ = false;
      depth_ = 0;
      return true;
    }
    case Mode::kPlain:
      emit_content(buf_);
      consume(buf_.size());
      return false;
  }
  return false;
}

bool OutputParser::step_content(bool final) {
  const ToolCallFormat f = opt_.formats.tool_calls;
  if (f == ToolCallFormat::kNone) {
    emit_content(buf_);
    consume(buf_.size());
    return false;
  }
  if (f == ToolCallFormat::kLlama3Json) {
    // Only an output that starts with a JSON object (or <|python_tag|>) is a call.
    const size_t i = buf_.find_first_not_of(kWs);
    emit_content(std::string_view(buf_).substr(0, i == std::string::npos ? buf_.size() : i));
    consume(i == std::string::npos ? buf_.size() : i);
    if (buf_.empty()) return false;
    if (starts_with(buf_, kPythonTag)) {
      json_prefix_ = std::string(kPythonTag);
      consume(kPythonTag.size());
    } else if (!final && is_partial(buf_, kPythonTag)) {
      return false;
    } else if (buf_[0] != '{') {
      mode_ = Mode::kPlain;
      return true;
    }
    mode_ = Mode::kJsonCall;
    scan_ = 0;
    in_string_ = escaped_ = false;
    depth_ = 0;
    return true;
  }
  // hermes, qwen3_coder: a call starts at <tool_call> (or a bare <function=).
  const bool xml = f == ToolCallFormat::kQwen3Coder;
  size_t at = buf_.find(kToolOpen);
  if (xml) at = std::min(at, buf_.find(kFunctionOpen));
  if (at != std::string::npos) {
    emit_content(std::string_view(buf_).substr(0, at));
    consume(at);
    mode_ = xml ? Mode::kXmlCall : Mode::kHermesCall;
    scan_ = 0;
    in_string_ = escaped_ = false;
    return true;
  }
  size_t keep = 0;
  if (!final) {
    keep = partial_suffix(buf_, kToolOpen);
    if (xml) keep = std::max(keep, partial_suffix(buf_, kFunctionOpen));
  }
  emit_content(std::string_view(buf_).substr(0, buf_.size() - keep));
  consume(buf_.size() - keep);
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
    if (!starts_with(body.substr(p), kFunctionOpen)) return false;
    const size_t gt = body.find('>', p + kFunctionOpen.size());
    if (gt == std::string_view::npos) return false;
    const std::string name(
        trim(body.substr(p + kFunctionOpen.size(), gt - p - kFunctionOpen.size())));
    if (name.empty() || name.find_first_of("<\n") != std::string::npos) return false;
    ordered_json args = ordered_json::object();
    size_t q = gt + 1;
    for (;;) {
      q = skip_ws(body, q);
      if (starts_with(body.substr(q), kFunctionClose)) {
        q += kFunctionClose.size();
        break;
      }
      if (!starts_with(body.substr(q), kParameterOpen)) return false;
      const size_t pgt = body.find('>', q + kParameterOpen.size());
      if (pgt == std::string_view::npos) return false;
      const std::string param(
          trim(body.substr(q + kParameterOpen.size(), pgt - q - kParameterOpen.size())));
      if (param.empty() || param.find_first_of("<\n") != std::string::npos) return false;
      size_t vstart = pgt + 1;
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

int count_reasoning_tokens(const Tokenizer& tok, const std::vector<int32_t>& ids,
                           std::pair<size_t, size_t> span) {
  if (span.first >= span.second) return 0;
  StreamDecoder decoder(tok, /*skip_special_tokens=*/true);
  size_t pos = 0;
  int n = 0;
  for (int32_t id : ids) {
    const size_t start = pos;
    pos += decoder.push(id).size();
    // A token inside the span; one with no text yet (an incomplete UTF-8 sequence)
    // belongs where its text starts.
    if (start >= span.first && (pos > start ? pos <= span.second : start < span.second)) ++n;
  }
  return n;
}

}  // namespace ninfer
