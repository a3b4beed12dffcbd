// Structured output on the API: the request fields that constrain the output to a
// grammar, and the constraints they become (runtime_cpp/structured/).
//
// Accepted, for chat and completions alike (as vLLM does):
//   response_format   {"type": "text" | "json_object" | "json_schema" | "structural_tag"}
//                     json_schema: {"name", "schema", "strict", "description"} (OpenAI);
//                     structural_tag: {"format": {...}} (xgrammar's, as vLLM takes it)
//   structured_outputs  vLLM: one of {json, regex, choice, grammar, json_object,
//                     structural_tag}, plus disable_any_whitespace, disable_fallback
//   guided_json, guided_regex, guided_choice, guided_grammar   vLLM's older fields
// More than one constraint in a request, or a field or value not supported, is a 400
// naming it; so is a grammar xgrammar rejects (with xgrammar's message).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "engine/constraint.h"
#include "server/api.h"
#include "structured/grammar.h"
#include "structured/reasoning_gate.h"
#include "structured/tool_grammar.h"
#include "text/tokenizer.h"

namespace ninfer {

// Fills r.grammar / r.grammar_param from the body (`body_text` is its text: a schema is
// read from it in its own key order, the order xgrammar makes the output follow); throws
// ApiError (400).
void parse_structured_output(const nlohmann::json& body, const std::string& body_text,
                             CompletionRequest& r);

// The request's grammar as engine constraints (none without one): compiled here, so a
// grammar xgrammar rejects is a 400 before the request is queued. `compiler` may be null
// (a server without the grammar engine): a request with a grammar is then refused.
// `reasoning`: where a chat prompt leaves the reasoning block (kNone for completions and
// for chats without one, enable_thinking=false included); otherwise the grammar applies
// only once the block is closed (structured/reasoning_gate.h). `tok` must outlive the
// constraints.
TokenConstraints structured_output_constraints(const CompletionRequest& r,
                                               const GrammarCompiler* compiler,
                                               const Tokenizer& tok,
                                               ToolReasoning reasoning = ToolReasoning::kNone);

// The hook for forced tool calls (issue 13 item 3): tool_choice "required" or a named
// function, over the request's tools, in the server's tool-call format (hermes,
// qwen3_coder, llama3_json; see structured/tool_grammar.h). Empty for "auto", "none" or
// a null tool_choice. Throws ApiError 400 (param tool_choice or tools) for a bad choice or
// a parameters schema xgrammar rejects.
TokenConstraints tool_choice_constraints(const GrammarCompiler& compiler, const std::string& format,
                                         const nlohmann::ordered_json& tools,
                                         const nlohmann::ordered_json& tool_choice,
                                         ToolReasoning reasoning = ToolReasoning::kNone);

}  // namespace ninfer
