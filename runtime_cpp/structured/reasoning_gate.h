// Structured output after the reasoning. A thinking model's output is free text until its
// reasoning block is closed ("</think>"); only the answer follows the request's grammar,
// as vLLM applies structured output from the reasoning parser's end token on. The gate
// wraps the grammar's constraint (engine/constraint.h):
//
//   kThinkBlock   the output may open "<think>" at its very start (Qwen3 with thinking
//                 on). The first token is either the start of "<think>" (the rest of its
//                 tokens are then forced) or one the grammar allows; in the second case
//                 there is no block and the grammar applies from the first token.
//   kInsideThink  the prompt opened the block (QwQ, DeepSeek-R1 distills, Qwen3.5): the
//                 output starts inside it.
//
// Inside the block nothing is masked. After "</think>" the template's separator "\n\n"
// may follow (Qwen3 renders "</think>\n\n"; a thinking budget forces it), token by token,
// or the grammar may start at once; from the first token that is not the separator's, the
// grammar decides everything, ends the output when it is complete, and the gate is done.
//
// Tokens are seen as the engine decodes them (special tokens as no text), as the output
// parsers see them. A token that closes the block and carries the answer's first bytes
// after the separator (a tokenizer without a "</think>" token of its own) passes them to
// the grammar as text (GrammarConstraint::accept_string); if the grammar refuses them the
// request fails.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/constraint.h"
#include "structured/tool_grammar.h"
#include "text/tokenizer.h"

namespace ninfer {

class ReasoningGate : public TokenConstraint {
 public:
  // `reasoning`: kThinkBlock or kInsideThink (kNone needs no gate: std::logic_error).
  // `tok` must outlive the gate.
  ReasoningGate(std::shared_ptr<TokenConstraint> inner, const Tokenizer& tok,
                ToolReasoning reasoning);

  void prepare() override;
  void apply(float* logits, int vocab) override;
  bool accept(int32_t token) override;
  bool finished() const override;
  std::shared_ptr<TokenConstraint> clone() override;

  bool answering() const { return phase_ == Phase::kAnswer; }  // the grammar has taken over

 private:
  enum class Phase { kStart, kOpening, kReasoning, kSeparator, kAnswer };
  ReasoningGate(const ReasoningGate& other, std::shared_ptr<TokenConstraint> inner);
  // kSeparator: the ids of `seps_` whose text continues the separator.
  std::vector<int32_t> separator_tokens() const;
  // Text after "</think>" in the token that closed the block.
  bool after_close(const std::string& rest);

  std::shared_ptr<TokenConstraint> inner_;
  const Tokenizer& tok_;
  Phase phase_;
  std::vector<int32_t> open_;                          // "<think>" as tokens
  size_t opened_ = 0;                                  // kOpening: tokens of open_ emitted
  std::string tail_;                                   // kReasoning: the block's last bytes
  std::vector<std::pair<int32_t, std::string>> seps_;  // single tokens of "\n" and "\n\n"
  size_t sep_done_ = 0;                                // kSeparator: bytes of "\n\n" seen
  std::vector<float> saved_;                           // apply(): logits kept around inner's
};

}  // namespace ninfer
