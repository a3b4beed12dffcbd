// Grammars for forced tool calls: tool_choice "required" (one or more calls of any of the
// request's tools) and a named function (exactly one call of that tool) constrain the
// output to the model's own tool-call syntax, with each call's arguments constrained by
// its tool's `parameters` schema. Built as xgrammar structural tags (JSON).
//
// Formats (the syntax the chat templates render for assistant tool calls, and what the
// tool-call parsers read back):
//   hermes       Qwen2.5 / Qwen3 / Hermes: calls separated by "\n", each
//                  <tool_call>\n{"name": "NAME", "arguments": {...}}\n</tool_call>
//   qwen3_coder  Qwen3-Coder / Qwen3.5 XML: calls separated by "\n", each
//                  <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n
//                  </function>\n</tool_call>
//                (string values raw, other values as JSON)
//   llama3_json  Llama 3.1 / 3.2 / 3.3: a single call (the template renders one per
//                message)   {"name": "NAME", "parameters": {...}}
//
// Tools are ordered JSON (parsed with nlohmann::ordered_json): xgrammar emits an object's
// properties in the schema's order, which a std::map-backed json would sort.
//
// Reasoning: with kThinkBlock the output may first hold a <think>...</think> block
// (free text, then "\n\n"), as Qwen3 thinking models emit it; with kInsideThink the
// prompt already opened <think> and the grammar starts with the block's free text.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/constraint.h"
#include "structured/grammar.h"

namespace ninfer {

enum class ToolReasoning { kNone, kThinkBlock, kInsideThink };

// The formats tool_call_structural_tag knows.
bool is_tool_call_format(const std::string& format);

// The structural tag (JSON text) for `tool_choice` over `tools` (OpenAI shapes); empty
// for "auto", "none" or null, which constrain nothing. Throws std::invalid_argument
// naming what is wrong (unknown format, no tools, a named function that is not a tool).
std::string tool_call_structural_tag(const std::string& format, const nlohmann::ordered_json& tools,
                                     const nlohmann::ordered_json& tool_choice,
                                     ToolReasoning reasoning = ToolReasoning::kNone);

// The constraint for a request's tool_choice; nullptr where it constrains nothing.
// Throws std::invalid_argument as above, GrammarError for a parameters schema xgrammar
// rejects.
std::shared_ptr<TokenConstraint> make_tool_call_constraint(
    const GrammarCompiler& compiler, const std::string& format, const nlohmann::ordered_json& tools,
    const nlohmann::ordered_json& tool_choice, ToolReasoning reasoning = ToolReasoning::kNone);

}  // namespace ninfer
