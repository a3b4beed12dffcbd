// The output parsers (server/output_parser.h) and the thinking budget
// (server/thinking_budget.h), without a server: every format on outputs written as the
// models write them, each fed whole, one byte at a time, split at every single point and
// at random points; the parsed message must be the expected one and the concatenated
// deltas must be the parsed message, whatever the split. Run by
// tests/test_output_parsers.py.
//
// usage: test_output_parser
#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "byte_vocab.h"
#include "check.h"
#include "server/output_parser.h"
#include "server/thinking_budget.h"
#include "text/tokenizer.h"

namespace ninfer::fake {
namespace {

using nlohmann::json;

struct Call {
  std::string name, arguments;
};

struct Expected {
  std::string reasoning, content;
  std::vector<Call> calls;
};

std::string show(const ParsedOutput& p) {
  std::string s = "reasoning=" + json(p.reasoning).dump() + " content=" + json(p.content).dump();
  for (const auto& c : p.tool_calls) s += " call " + c.name + " " + c.arguments;
  return s;
}

bool same(const ParsedOutput& p, const Expected& e) {
  if (p.reasoning != e.reasoning || p.content != e.content) return false;
  if (p.tool_calls.size() != e.calls.size()) return false;
  for (size_t i = 0; i < e.calls.size(); ++i)
    if (p.tool_calls[i].name != e.calls[i].name ||
        p.tool_calls[i].arguments != e.calls[i].arguments || p.tool_calls[i].id.size() != 29 ||
        p.tool_calls[i].id.rfind("call_", 0) != 0)
      return false;
  return true;
}

// Feeds `pieces`, reassembles the deltas, checks both against `want`.
void check_split(const OutputParserOptions& opt, const std::string& prompt,
                 const std::vector<std::string>& pieces, const Expected& want,
                 const std::string& what) {
  OutputParser p(opt, prompt);
  ParsedOutput joined;
  auto add = [&](const OutputDelta& d) {
    joined.reasoning += d.reasoning;
    joined.content += d.content;
    for (const auto& c : d.tool_calls) {
      if (!c.id.empty()) {
        CHECK(c.index == static_cast<int>(joined.tool_calls.size()));
        joined.tool_calls.push_back({c.id, c.name, ""});
      }
      CHECK(c.index >= 0 && c.index < static_cast<int>(joined.tool_calls.size()));
      joined.tool_calls[c.index].arguments += c.arguments;
    }
  };
  for (const auto& piece : pieces) add(p.feed(piece));
  add(p.finish());
  if (!same(p.parsed(), want))
    fail(what + ": parsed " + show(p.parsed()) +
         "\n  want reasoning=" + json(want.reasoning).dump() +
         " content=" + json(want.content).dump() + " calls=" + std::to_string(want.calls.size()));
  if (!same(joined, want)) fail(what + ": deltas reassemble to " + show(joined));
}

void check_all_splits(const OutputParserOptions& opt, const std::string& prompt,
                      const std::string& text, const Expected& want, const std::string& name) {
  check_split(opt, prompt, {text}, want, name + " (whole)");
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  check_split(opt, prompt, bytes, want, name + " (bytes)");
  for (size_t cut = 1; cut < text.size(); ++cut)
    check_split(opt, prompt, {text.substr(0, cut), text.substr(cut)}, want,
                name + " (cut at " + std::to_string(cut) + ")");
  std::mt19937 rng(1234);
  for (int round = 0; round < 30; ++round) {
    std::vector<std::string> pieces;
    for (size_t i = 0; i < text.size();) {
      const size_t n = 1 + rng() % 9;
      pieces.push_back(text.substr(i, n));
      i += n;
    }
    check_split(opt, prompt, pieces, want, name + " (random " + std::to_string(round) + ")");
  }
}

OutputParserOptions formats(ReasoningFormat r, ToolCallFormat t, json tools = nullptr) {
  OutputParserOptions o;
  o.formats = {r, t};
  o.tools = std::move(tools);
  return o;
}

const std::string kQwen3Prompt = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n";
const std::string kOpenPrompt = "<｜User｜>hi<｜Assistant｜><think>\n";  // R1 distills, QwQ
const std::string kClosedPrompt = kQwen3Prompt + "<think>\n\n</think>\n\n";

void test_reasoning() {
  CHECK(reasoning_start(ReasoningFormat::kThink, kQwen3Prompt) == ReasoningStart::kMaybe);
  CHECK(reasoning_start(ReasoningFormat::kThink, kOpenPrompt) == ReasoningStart::kInside);
  CHECK(reasoning_start(ReasoningFormat::kThink, kClosedPrompt) == ReasoningStart::kClosed);
  CHECK(reasoning_start(ReasoningFormat::kNone, kOpenPrompt) == ReasoningStart::kNone);
  // An earlier turn's closed block is history, not this turn's switch.
  CHECK(reasoning_start(ReasoningFormat::kThink, "<think>\nx\n</think>\n\nold answer<|im_end|>\n" +
                                                     kQwen3Prompt) == ReasoningStart::kMaybe);

  const auto think = formats(ReasoningFormat::kThink, ToolCallFormat::kNone);
  check_all_splits(think, kQwen3Prompt,
                   "<think>\nLet me think: 2 + 2.\n\nIt is 4.\n</think>\n\nThe answer is 4.\n",
                   {"Let me think: 2 + 2.\n\nIt is 4.", "The answer is 4.\n", {}}, "qwen3 think");
  check_all_splits(think, kOpenPrompt, "Okay, 2 + 2 < 5.\n</think>\n\n4",
                   {"Okay, 2 + 2 < 5.", "4", {}}, "open prompt");
  check_all_splits(think, kOpenPrompt, "still thinking <b>", {"still thinking <b>", "", {}},
                   "unclosed reasoning");
  check_all_splits(think, kClosedPrompt, "Hi <think>x</think> there",
                   {"", "Hi <think>x</think> there", {}}, "thinking off");
  check_all_splits(think, kQwen3Prompt, "Hello <think>", {"", "Hello <think>", {}}, "no block");
  check_all_splits(think, kQwen3Prompt, "  <thin", {"", "  <thin", {}}, "a marker's start only");
  check_all_splits(think, kQwen3Prompt, "<think>\n\n</think>\n\nDone.", {"", "Done.", {}},
                   "empty block");
  check_all_splits(formats(ReasoningFormat::kNone, ToolCallFormat::kNone), kOpenPrompt,
                   "<think>a</think>b", {"", "<think>a</think>b", {}}, "no reasoning parser");
}

void test_hermes() {
  const auto hermes = formats(ReasoningFormat::kThink, ToolCallFormat::kHermes);
  check_all_splits(
      hermes, kQwen3Prompt,
      "I'll check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\", \"unit\": \"c\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", "
      "\"arguments\": {\"tz\": \"CET\"}}\n</tool_call>",
      {"",
       "I'll check.",
       {{"get_weather", R"({"city":"Paris","unit":"c"})"}, {"get_time", R"({"tz":"CET"})"}}},
      "hermes two calls");
  check_all_splits(
      hermes, kQwen3Prompt,
      "<think>\nNeed the weather.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", "
      "\"arguments\": {\"city\": \"</tool_call> é\"}}\n</tool_call>",
      {"Need the weather.", "", {{"get_weather", R"({"city":"</tool_call> é"})"}}},
      "reasoning then a call; the marker inside a string");
  check_all_splits(hermes, kQwen3Prompt, "<tool_call>\n{\"name\": get_weather}\n</tool_call> ok",
                   {"", "<tool_call>\n{\"name\": get_weather}\n</tool_call> ok", {}},
                   "malformed call is content");
  check_all_splits(hermes, kQwen3Prompt, "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}",
                   {"", "", {{"f", "{}"}}}, "unclosed but complete");
  check_all_splits(hermes, kQwen3Prompt, "x <tool_call>\n{\"name\": \"f\", \"argu",
                   {"", "x <tool_call>\n{\"name\": \"f\", \"argu", {}},
                   "truncated call is content");
  check_all_splits(hermes, kQwen3Prompt,
                   "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>",
                   {"", "", {{"f", R"({"a":1})"}}}, "arguments as a string");
  check_all_splits(hermes, kQwen3Prompt, "a <tool> b\n\n", {"", "a <tool> b\n\n", {}},
                   "no call: text and trailing whitespace kept");
  auto one = hermes;
  one.max_tool_calls = 1;
  check_all_splits(
      one, kQwen3Prompt,
      "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>\n<tool_call>{\"name\": "
      "\"b\", \"arguments\": {}}</tool_call>",
      {"", "", {{"a", "{}"}}}, "parallel_tool_calls false");
}

void test_qwen3_coder() {
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
        "opts": {"type": "object"}, "zip": {"type": "string"}, "ratio": {"type": "number"},
        "tags": {"type": "array"}, "note": {"type": ["string", "null"]},
        "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}]}}}}}])");
  const auto xml = formats(ReasoningFormat::kThink, ToolCallFormat::kQwen3Coder, tools);
  check_all_splits(
      xml, kQwen3Prompt,
      "Checking.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco\n"
      "</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=metric>\nTrue\n</parameter>\n"
      "<parameter=opts>\n{\"a\": [1, 2]}\n</parameter>\n<parameter=zip>\n02139\n</parameter>\n"
      "<parameter=ratio>\n0.5\n</parameter>\n<parameter=tags>\n[\"x\"]\n</parameter>\n"
      "<parameter=note>\nnull\n</parameter>\n<parameter=limit>\nnull\n</parameter>\n"
      "<parameter=extra>\n7\n</parameter>\n</function>\n</tool_call>",
      {"",
       "Checking.",
       {{"get_weather",
         R"({"city":"San Francisco","days":3,"metric":true,"opts":{"a":[1,2]},"zip":"02139",)"
         R"("ratio":0.5,"tags":["x"],"note":null,"limit":null,"extra":"7"})"}}},
      "qwen3_coder typed parameters");
  check_all_splits(xml, kQwen3Prompt,
                   "<tool_call>\n<function=write>\n<parameter=text>\nline 1\n</parameter>\nline 2\n"
                   "</parameter>\n</function>\n</tool_call><tool_call>\n<function=b>\n</function>\n"
                   "</tool_call>",
                   {"", "", {{"write", R"({"text":"line 1\n</parameter>\nline 2"})"}, {"b", "{}"}}},
                   "a value holding </parameter>; a call without parameters");
  check_all_splits(xml, kQwen3Prompt,
                   "<function=get_weather>\n<parameter=days>\nthree\n</parameter>\n</function>\nok",
                   {"", "ok", {{"get_weather", R"({"days":"three"})"}}},
                   "bare function; a value not of its type stays a string");
  check_all_splits(
      xml, kQwen3Prompt, "<tool_call>\n<function=f>\n<parameter=x>\n1\n</function>\n</tool_call>",
      {"", "<tool_call>\n<function=f>\n<parameter=x>\n1\n</function>\n</tool_call>", {}},
      "malformed xml is content");
  check_all_splits(xml, kQwen3Prompt, "<tool_call>\n<function=f>\n<parameter=x>\n1",
                   {"", "<tool_call>\n<function=f>\n<parameter=x>\n1", {}}, "truncated xml");
}

void test_llama3_json() {
  const auto llama = formats(ReasoningFormat::kNone, ToolCallFormat::kLlama3Json);
  check_all_splits(
      llama, "",
      "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"n\": [1, {}]}}",
      {"", "", {{"get_weather", R"({"city":"Paris","n":[1,{}]})"}}}, "llama3 call");
  check_all_splits(llama, "",
                   "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", "
                   "\"arguments\": {\"x\": \"}\"}}",
                   {"", "", {{"a", "{}"}, {"b", R"({"x":"}"})"}}}, "python_tag, two calls");
  check_all_splits(llama, "", "{\"answer\": 42} is JSON", {"", "{\"answer\": 42} is JSON", {}},
                   "an object that is no call");
  check_all_splits(llama, "", "Sure: {\"name\": \"a\", \"parameters\": {}}",
                   {"", "Sure: {\"name\": \"a\", \"parameters\": {}}", {}}, "not at the start");
  check_all_splits(llama, "", "{not json", {"", "{not json", {}}, "not JSON");
  check_all_splits(llama, "", "{\"name\": \"a\", \"para", {"", "{\"name\": \"a\", \"para", {}},
                   "truncated");
  check_all_splits(llama, "", "{\"name\": \"a\", \"parameters\": {}}\nDone.",
                   {"", "Done.", {{"a", "{}"}}}, "a call, then text");
}

Tokenizer byte_tokenizer() {
  return Tokenizer::from_json(byte_tokenizer_json(
      {{"<eos>", true}, {"<think>", false}, {"</think>", false}, {"<tool_call>", false}}));
}

void test_reasoning_tokens() {
  const Tokenizer tok = byte_tokenizer();
  const std::string text = "<think>\nabc\n</think>\n\nok";
  const std::vector<int32_t> ids = tok.encode(text, false);
  CHECK(ids.size() == 11);  // <think> \n a b c \n </think> \n \n o k
  OutputParser p(formats(ReasoningFormat::kThink, ToolCallFormat::kNone), kQwen3Prompt);
  p.feed(text);
  p.finish();
  CHECK(p.parsed().reasoning == "abc" && p.parsed().content == "ok");
  CHECK(count_reasoning_tokens(tok, ids, p.reasoning_span()) == 5);  // \n a b c \n
  OutputParser none(formats(ReasoningFormat::kThink, ToolCallFormat::kNone), kQwen3Prompt);
  none.feed("just an answer");
  none.finish();
  CHECK(count_reasoning_tokens(tok, tok.encode("just an answer", false), none.reasoning_span()) ==
        0);
}

// A model that would write `script` forever, under the budget: returns the output.
std::string run_budget(const Tokenizer& tok, int budget, ReasoningStart start,
                       const std::string& script, int steps, int* reasoning_tokens) {
  ThinkingBudget b(tok, budget, start);
  const std::vector<int32_t> want = tok.encode(script, false);
  const int vocab = tok.vocab_size();
  std::vector<int32_t> out;
  size_t next = 0;  // the script's next token: the model goes on where it was cut off
  for (int i = 0; i < steps; ++i) {
    std::vector<float> logits(vocab, 0.0f);
    logits[want[std::min(next, want.size() - 1)]] = 10.0f;
    b.prepare();
    b.apply(logits.data(), vocab);
    const int32_t t =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    CHECK(b.accept(t));
    if (next < want.size() && t == want[next]) ++next;
    out.push_back(t);
  }
  *reasoning_tokens = b.reasoning_tokens();
  return tok.decode(out, true);
}

void test_thinking_budget() {
  const Tokenizer tok = byte_tokenizer();
  int n = -1;
  // Prompt opened the block: 2 tokens of the model's, the forced newline makes 3.
  CHECK(run_budget(tok, 3, ReasoningStart::kInside, "abcdefghijklmnop", 8, &n) ==
        "ab\n</think>\n\ncd");
  CHECK(n == 3);
  // The output opens it: counted after <think>; budget 0 closes it at once.
  CHECK(run_budget(tok, 0, ReasoningStart::kMaybe, "<think>xyzxyzxyz", 5, &n) ==
        "<think></think>\n\nx");
  CHECK(n == 0);
  // Closed by the model before the budget: nothing forced.
  CHECK(run_budget(tok, 50, ReasoningStart::kMaybe, "<think>ab</think>cd", 6, &n) ==
        "<think>ab</think>cd");
  CHECK(n == 2);
  // No block opened: never forced.
  CHECK(run_budget(tok, 1, ReasoningStart::kMaybe, "hello world", 6, &n) == "hello ");
  // What the parser counts agrees with the budget.
  const std::string text = run_budget(tok, 4, ReasoningStart::kInside, "thinking hard", 12, &n);
  CHECK(n == 4);
  OutputParser p(formats(ReasoningFormat::kThink, ToolCallFormat::kNone), kOpenPrompt);
  p.feed(text);
  p.finish();
  CHECK(p.parsed().reasoning == "thi" && p.parsed().content == "nking");
  CHECK(count_reasoning_tokens(tok, tok.encode(text, false), p.reasoning_span()) == 4);
}

void test_names() {
  CHECK(parse_reasoning_format("think") == ReasoningFormat::kThink);
  CHECK(parse_reasoning_format("deepseek_r1") == ReasoningFormat::kThink);
  CHECK(parse_tool_call_format("qwen3_coder") == ToolCallFormat::kQwen3Coder);
  for (auto f : {ToolCallFormat::kNone, ToolCallFormat::kHermes, ToolCallFormat::kQwen3Coder,
                 ToolCallFormat::kLlama3Json})
    CHECK(parse_tool_call_format(format_name(f)) == f);
  bool threw = false;
  try {
    parse_tool_call_format("mistral");
  } catch (const std::invalid_argument& e) {
    threw = std::string(e.what()).find("hermes") != std::string::npos;
  }
  CHECK(threw);
}

}  // namespace
}  // namespace ninfer::fake

int main() {
  using namespace ninfer::fake;
  test_names();
  test_reasoning();
  test_hermes();
  test_qwen3_coder();
  test_llama3_json();
  test_reasoning_tokens();
  test_thinking_budget();
  std::printf("output parsers ok\n");
  return 0;
}
