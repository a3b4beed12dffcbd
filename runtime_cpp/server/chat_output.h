// A chat choice's output in OpenAI's shapes: the request fields that steer reasoning and
// tool calls, and the message, stream deltas, finish_reason and usage details built from
// the output parser (output_parser.h). JSON stays here; routes.cpp makes one ChatOutput
// per chat choice, feeds it the engine's text events and asks it for what to send.
//
// Request fields (chat only):
//   tools, tool_choice      "none" turns tool-call parsing off (the template still gets
//                           the tools, as vLLM does); "auto" (the default); "required"
//                           and a named function are forced through the grammar engine
//                           (Routes::forced_tool_call)
//   parallel_tool_calls     false: only the first tool call is returned (later ones are
//                           dropped); vLLM ignores the field
//   reasoning_effort        "none" sets chat_template_kwargs.enable_thinking = false
//                           (unless the client set it); minimal|low|medium|high reach the
//                           template as chat_template_kwargs.reasoning_effort
//   include_reasoning       (vLLM) false: the reasoning is still split off, but left out
//   thinking_budget         (also thinking_token_budget, vLLM's name) tokens of reasoning
//                           before the block is closed (thinking_budget.h); -1 unlimited;
//                           default --reasoning-budget; 400 without a reasoning parser
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/constraint.h"
#include "server/output_parser.h"
#include "text/tokenizer.h"

namespace ninfer {

struct CompletionRequest;

// Reasoning and tool-call settings of one request (CompletionRequest::output).
struct OutputRequest {
  bool parallel_tool_calls = true;
  bool include_reasoning = true;
  std::string reasoning_effort;        // "" when not given
  std::optional<int> thinking_budget;  // tokens; -1 unlimited; unset: the server's
};

// Parses the fields above into `r` (r.tools, r.tool_choice, r.chat_template_kwargs,
// r.output); throws ApiError (400) naming the field. Called by parse_completion_request
// for chat requests.
void parse_output_request(const nlohmann::json& body, CompletionRequest& r);

class ChatOutput {
 public:
  // `prompt`: the rendered chat prompt. Throws ApiError for what the server's parsers
  // cannot serve (a thinking budget without a reasoning parser).
  ChatOutput(const OutputConfig& config, const CompletionRequest& r, std::string_view prompt,
             const Tokenizer& tok);

  // The thinking budget to append to GenerationRequest::constraints, or null.
  std::shared_ptr<TokenConstraint> constraint() const { return budget_; }

  // The "delta" objects of the chunks to stream for one engine text event, in order
  // (none while text is held back); on_done() flushes at kDone.
  std::vector<nlohmann::json> on_text(const std::string& text, const std::vector<int32_t>& tokens);
  std::vector<nlohmann::json> on_done();

  // "tool_calls" when calls were made and the model stopped on its own.
  std::string finish_reason(const std::string& engine_reason) const;
  // After on_done(): the non-streaming "message", and usage.completion_tokens_details.
  nlohmann::json message() const;
  void add_usage(nlohmann::json& usage) const;

 private:
  std::vector<nlohmann::json> deltas(const OutputDelta& d) const;

  const Tokenizer& tok_;
  bool reasoning_ = false;
  bool include_reasoning_ = true;
  OutputParser parser_;
  std::shared_ptr<TokenConstraint> budget_;
  std::vector<int32_t> tokens_;
};

}  // namespace ninfer
