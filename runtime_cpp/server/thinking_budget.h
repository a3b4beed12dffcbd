// A thinking budget: after N reasoning tokens the reasoning block is closed by forcing the
// tokens of "\n</think>\n\n" (a TokenConstraint, engine/constraint.h). The tokens are
// counted as usage.completion_tokens_details.reasoning_tokens counts them: those after
// the one that opened the block (or from the first, when the prompt opened it), up to the
// closing marker; the forced newline before the marker is one of them, so a block closed by
// the budget holds exactly N reasoning tokens (0: the block is closed at once).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/constraint.h"
#include "server/output_parser.h"
#include "text/tokenizer.h"

namespace ninfer {

class ThinkingBudget : public TokenConstraint {
 public:
  // `start` from reasoning_start() on the rendered prompt: kInside or kMaybe (kMaybe waits
  // for the output to open <think> at its start). `tok` must outlive the constraint.
  ThinkingBudget(const Tokenizer& tok, int budget, ReasoningStart start);
  void apply(float* logits, int vocab) override;
  bool accept(int32_t token) override;
  std::shared_ptr<TokenConstraint> clone() override {
    return std::make_shared<ThinkingBudget>(*this);
  }

  int reasoning_tokens() const { return count_; }
  bool forcing() const { return state_ == State::kForcing; }

 private:
  enum class State { kWaitOpen, kReasoning, kForcing, kDone };
  void maybe_force();

  const Tokenizer& tok_;
  int budget_;
  std::vector<int32_t> close_;  // "\n</think>\n\n"
  int lead_ = 0;                // tokens of close_ before the one that starts "</think>"
  State state_;
  int count_ = 0;
  size_t forced_ = 0;  // next index into close_
  std::string text_;   // kWaitOpen: the output so far; kReasoning: its last bytes
};

}  // namespace ninfer
