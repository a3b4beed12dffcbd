#include "server/thinking_budget.h"

#include <limits>
#include <stdexcept>

namespace ninfer {

namespace {

constexpr std::string_view kOpen = "<think>";
constexpr std::string_view kClose = "</think>";

std::string token_text(const Tokenizer& tok, int32_t id) {
  if (tok.is_special(id)) return {};  // the engine decodes without special tokens
  try {
    return tok.token_bytes(id);
  } catch (const std::out_of_range&) {
    return {};
  }
}

}  // namespace

ThinkingBudget::ThinkingBudget(const Tokenizer& tok, int budget, ReasoningStart start)
    : tok_(tok), budget_(budget),
      state_(start == ReasoningStart::kInside ? State::kReasoning : State::kWaitOpen) {
  if (start != ReasoningStart::kInside && start != ReasoningStart::kMaybe)
    throw std::logic_error("ThinkingBudget: the prompt leaves no reasoning block to budget");
  close_ = tok.encode("\n</think>\n\n", /*add_special_tokens=*/false);
  std::string seen;
  for (lead_ = 0; lead_ < static_cast<int>(close_.size()); ++lead_) {
    seen += token_text(tok, close_[lead_]);
    if (seen.find('<') != std::string::npos) break;
  }
  if (lead_ == static_cast<int>(close_.size()))
    throw std::logic_error("ThinkingBudget: \"</think>\" does not tokenize");
  if (state_ == State::kReasoning) maybe_force();
}

void ThinkingBudget::maybe_force() {
  // The forced newline counts as reasoning: start forcing so the total is the budget.
  if (count_ + lead_ < budget_) return;
  const int room = std::max(0, budget_ - count_);
  forced_ = static_cast<size_t>(lead_ - std::min(room, lead_));
  state_ = State::kForcing;
}

void ThinkingBudget::apply(float* logits, int vocab) {
  if (state_ != State::kForcing) return;
  const int32_t want = close_[forced_];
  if (want < 0 || want >= vocab)
    throw std::logic_error("ThinkingBudget: forced token outside the vocabulary");
  for (int v = 0; v < vocab; ++v)
    if (v != want) logits[v] = -std::numeric_limits<float>::infinity();
  if (!(logits[want] > -std::numeric_limits<float>::infinity())) logits[want] = 0.0f;
}

bool ThinkingBudget::accept(int32_t token) {
  switch (state_) {
    case State::kWaitOpen: {
      text_ += token_text(tok_, token);
      const size_t i = text_.find_first_not_of(" \t\r\n");
      if (i == std::string::npos) return true;
      const std::string_view rest = std::string_view(text_).substr(i);
      if (rest.size() >= kOpen.size() && rest.compare(0, kOpen.size(), kOpen) == 0) {
        // This token opened the block; what it carries after the marker is not counted
        // (as usage counts whole tokens inside the block).
        state_ = State::kReasoning;
        text_ = std::string(rest.substr(kOpen.size()));
        maybe_force();
      } else if (kOpen.compare(0, rest.size(), rest) != 0) {
        state_ = State::kDone;  // no reasoning block: nothing to budget
      }
      return true;
    }
    case State::kReasoning:
      text_ += token_text(tok_, token);
      if (text_.find(kClose) != std::string::npos) {
        state_ = State::kDone;  // closed by the model within the budget
        return true;
      }
      if (text_.size() > 2 * kClose.size()) text_.erase(0, text_.size() - kClose.size());
      ++count_;
      maybe_force();
      return true;
    case State::kForcing:
      if (token != close_[forced_]) return false;
      if (static_cast<int>(forced_) < lead_) ++count_;  // the newline before the marker
      if (++forced_ == close_.size()) state_ = State::kDone;
      return true;
    case State::kDone: return true;
  }
  return true;
}

}  // namespace ninfer
