// OutputParser's frame (output_parser.h): the format names, where the prompt leaves the
// reasoning, feeding and finishing, the emission of each channel (whitespace held at its
// edges) and the mode machine with the reasoning modes. The tool-call modes are in
// tool_call_parser.cpp.
#include "server/output_parser.h"

#include <stdexcept>

#include "server/output_markers.h"
#include "text/tokenizer.h"

namespace ninfer {

using namespace output_markers;  // NOLINT

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
      const size_t keep = held_back(buf_, final, {kThinkClose});
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
    case Mode::kJsonBetween: return step_json_between(final);
    case Mode::kPlain: pass_content(buf_.size()); return false;
  }
  return false;
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
