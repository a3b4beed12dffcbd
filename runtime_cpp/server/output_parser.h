// The model's generated text split back into what the OpenAI API returns: reasoning
// (`reasoning_content`), the answer (`content`) and tool calls (`tool_calls`).
//
// One OutputParser per choice is fed the text deltas as the engine produces them
// (complete UTF-8, GenerationEvent::text) and returns the deltas of each channel. Text that
// may be the start of a marker (`<think>`, `</think>`, `<tool_call>`, `<function=`, ...) is
// held back until it is decided; a tool call leaves whole, once its closing marker has
// arrived and it parsed, so a malformed call is given back as content (no text is ever
// lost) and the outcome is the same however the text was split into deltas. finish()
// flushes what is held; parsed() is then the whole message, which is exactly the
// concatenation of every delta.
//
// Formats (the names are those of the manifest's "output_parsers" and of the server's
// --reasoning-parser / --tool-call-parser):
//   reasoning  none | think       `<think>`...`</think>`; a prompt that ends inside an open
//                                 `<think>` (QwQ, DeepSeek-R1 distills, Qwen3.5) starts the
//                                 output inside the reasoning; a prompt that closed an
//                                 empty block (enable_thinking=false) has none; otherwise
//                                 the output may open `<think>` at its start. Whitespace
//                                 around the block is not part of either channel.
//   tool calls none | hermes      `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
//              qwen3_coder        `<tool_call><function=NAME><parameter=P>VALUE</parameter>
//                                 </function></tool_call>` (the wrapper may be missing);
//                                 VALUE converted by the tool's JSON schema type
//              llama3_json        `{"name": ..., "parameters": {...}}` as the whole output
//                                 (several separated by `;`), optionally after
//                                 `<|python_tag|>`
// Tool calls are only looked for outside the reasoning. Arguments leave as a JSON string
// (compact, keys in the order the model wrote them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace ninfer {

class Tokenizer;

enum class ReasoningFormat { kNone, kThink };
enum class ToolCallFormat { kNone, kHermes, kQwen3Coder, kLlama3Json };

struct OutputParsers {
  ReasoningFormat reasoning = ReasoningFormat::kNone;
  ToolCallFormat tool_calls = ToolCallFormat::kNone;
};

// The server's resolved settings (server/options.cpp resolve_output()).
struct OutputConfig {
  OutputParsers parsers;
  int reasoning_budget = -1;  // --reasoning-budget: tokens per request; -1 unlimited
};

// Names as in the manifest and on the command line; parse_* throw std::invalid_argument
// listing the known names. "qwen3" and "deepseek_r1" (vLLM's names) are accepted for think.
const char* format_name(ReasoningFormat f);
const char* format_name(ToolCallFormat f);
ReasoningFormat parse_reasoning_format(const std::string& name);
ToolCallFormat parse_tool_call_format(const std::string& name);
extern const char* const kReasoningFormatNames;  // "none, think"
extern const char* const kToolCallFormatNames;   // "none, hermes, qwen3_coder, llama3_json"

// Where the rendered prompt leaves the reasoning block: kInside (it opened `<think>` and
// did not close it), kClosed (it ends right after a `</think>`: thinking switched off),
// kMaybe (the output may open one at its start), kNone (no reasoning format).
enum class ReasoningStart { kNone, kMaybe, kInside, kClosed };
ReasoningStart reasoning_start(ReasoningFormat f, std::string_view prompt);

struct ToolCall {
  std::string id;  // "call_" + 24 random characters
  std::string name;
  std::string arguments;  // a JSON object as text
};

// A piece of tool call `index`: the first piece of a call carries its id and name.
struct ToolCallDelta {
  int index = 0;
  std::string id, name;
  std::string arguments;
};

struct OutputDelta {
  std::string reasoning;
  std::string content;
  std::vector<ToolCallDelta> tool_calls;
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
};

struct ParsedOutput {
  std::string reasoning;  // empty: none
  std::string content;
  std::vector<ToolCall> tool_calls;
};

struct OutputParserOptions {
  OutputParsers formats;
  // The OpenAI request's "tools" (an array of {"type": "function", "function": {...}});
  // qwen3_coder converts parameter values by their schema type. May be null.
  nlohmann::json tools;
  // Calls beyond this many are dropped (parallel_tool_calls: false keeps one); -1: all.
  int max_tool_calls = -1;
};

class OutputParser {
 public:
  // `prompt`: the rendered prompt (only its tail matters, see reasoning_start()).
  OutputParser(OutputParserOptions options, std::string_view prompt);
  OutputDelta feed(std::string_view text);
  OutputDelta finish();
  const ParsedOutput& parsed() const { return out_; }
  // The bytes [first, second) of the raw output that are reasoning text (the markers
  // excluded); first == second when there was none.
  std::pair<size_t, size_t> reasoning_span() const;

 private:
  enum class Mode {
    kStart,           // may open <think>
    kReasoning,       // inside <think>
    kAfterReasoning,  // skipping whitespace after </think>
    kContent,         // looking for tool calls
    kHermesCall,      // buffer starts with <tool_call>
    kXmlCall,         // buffer starts with <tool_call> or <function=
    kJsonCall,        // buffer starts with a JSON object (llama3_json)
    kJsonBetween,     // after a llama3_json call: `;` and another, or content
    kPlain,           // everything else is content
  };
  bool step(bool final);
  bool step_content(bool final);
  bool step_hermes(bool final);
  bool step_xml(bool final);
  bool step_json(bool final);
  bool step_json_between(bool final);
  // A llama3_json call may start at buf_[i], the first non-whitespace byte.
  bool start_json_call(size_t i, bool final);
  void begin_call(Mode mode);  // enters a call mode, its scan reset
  void consume(size_t n);
  void emit_reasoning(std::string_view text);
  void emit_content(std::string_view text);
  void pass_content(size_t n);  // the first n bytes of buf_ are content
  void emit_call(std::string name, std::string arguments);
  // Parses `<function=...>...</function>` blocks (the wrapper stripped); false if malformed.
  bool parse_xml_calls(std::string_view body,
                       std::vector<std::pair<std::string, std::string>>& out) const;
  nlohmann::ordered_json convert_parameter(const std::string& function, const std::string& param,
                                           const std::string& value) const;

  OutputParserOptions opt_;
  Mode mode_;
  std::string buf_;              // undecided raw text
  size_t consumed_ = 0;          // raw bytes before buf_
  std::string held_ws_;          // whitespace held back at the end of the channel being written
  bool reasoning_text_ = false;  // a non-whitespace character of reasoning was written
  size_t r_begin_ = 0, r_end_ = 0;
  bool json_started_ = false;  // llama3_json: a non-whitespace character of content seen
  std::string json_prefix_;    // llama3_json: <|python_tag|> consumed before the object
  // An incremental scan of the buffered call: position, JSON string state, depth.
  size_t scan_ = 0;
  bool in_string_ = false, escaped_ = false;
  int depth_ = 0;
  ParsedOutput out_;
  OutputDelta delta_;
};

// How many of `ids` (a choice's generated tokens, in order) are reasoning: tokens whose
// text, as the engine decodes it, lies within `span` (OutputParser::reasoning_span()).
int count_reasoning_tokens(const Tokenizer& tok, const std::vector<int32_t>& ids,
                           std::pair<size_t, size_t> span);

}  // namespace ninfer
