#include "structured/reasoning_gate.h"

#include <limits>
#include <stdexcept>
#include <string_view>
#include <utility>

#include "structured/grammar.h"

namespace ninfer {

namespace {

constexpr std::string_view kClose = "</think>";
constexpr std::string_view kSeparator = "\n\n";
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// A token's text as the engine decodes it (special tokens skipped).
std::string token_text(const Tokenizer& tok, int32_t id) {
  if (tok.is_special(id)) return {};
  try {
    return tok.token_bytes(id);
  } catch (const std::out_of_range&) {
    return {};
  }
}

}  // namespace

ReasoningGate::ReasoningGate(std::shared_ptr<TokenConstraint> inner, const Tokenizer& tok,
                             ToolReasoning reasoning)
    : inner_(std::move(inner)), tok_(tok) {
  if (!inner_) throw std::logic_error("ReasoningGate: no grammar to gate");
  switch (reasoning) {
    case ToolReasoning::kThinkBlock: phase_ = Phase::kStart; break;
    case ToolReasoning::kInsideThink: phase_ = Phase::kReasoning; break;
    default: throw std::logic_error("ReasoningGate: the output has no reasoning block");
  }
  open_ = tok.encode("<think>", /*add_special_tokens=*/false);
  if (open_.empty()) throw std::logic_error("ReasoningGate: \"<think>\" does not tokenize");
  for (std::string_view s : {std::string_view("\n"), kSeparator}) {
    const std::vector<int32_t> ids = tok.encode(std::string(s), /*add_special_tokens=*/false);
    if (ids.size() == 1 && token_text(tok, ids[0]) == s) seps_.emplace_back(ids[0], s);
  }
}

ReasoningGate::ReasoningGate(const ReasoningGate& other, std::shared_ptr<TokenConstraint> inner)
    : inner_(std::move(inner)), tok_(other.tok_), phase_(other.phase_), open_(other.open_),
      opened_(other.opened_), tail_(other.tail_), seps_(other.seps_), sep_done_(other.sep_done_) {}

std::shared_ptr<TokenConstraint> ReasoningGate::clone() {
  auto inner = inner_->clone();
  if (!inner) return nullptr;
  return std::shared_ptr<TokenConstraint>(new ReasoningGate(*this, std::move(inner)));
}

std::vector<int32_t> ReasoningGate::separator_tokens() const {
  std::vector<int32_t> ids;
  const std::string_view rest = kSeparator.substr(sep_done_);
  for (const auto& [id, text] : seps_)
    if (rest.substr(0, text.size()) == text) ids.push_back(id);
  return ids;
}

void ReasoningGate::prepare() {
  if (phase_ == Phase::kStart || phase_ == Phase::kSeparator || phase_ == Phase::kAnswer)
    inner_->prepare();
}

void ReasoningGate::apply(float* logits, int vocab) {
  switch (phase_) {
    case Phase::kReasoning: return;  // free
    case Phase::kAnswer: inner_->apply(logits, vocab); return;
    case Phase::kOpening:  // the rest of "<think>"
      for (int v = 0; v < vocab; ++v)
        if (v != open_[opened_]) logits[v] = kNegInf;
      return;
    case Phase::kStart:
    case Phase::kSeparator: {
      // What the grammar allows, and the tokens that open the block / continue the
      // separator (with the logits they had).
      const std::vector<int32_t> also =
          phase_ == Phase::kStart ? std::vector<int32_t>{open_[0]} : separator_tokens();
      saved_.clear();
      for (int32_t id : also) saved_.push_back(id >= 0 && id < vocab ? logits[id] : kNegInf);
      inner_->apply(logits, vocab);
      for (size_t i = 0; i < also.size(); ++i)
        if (also[i] >= 0 && also[i] < vocab) logits[also[i]] = saved_[i];
      return;
    }
  }
}

bool ReasoningGate::after_close(const std::string& rest) {
  phase_ = Phase::kSeparator;
  sep_done_ = 0;
  size_t i = 0;
  while (i < rest.size() && sep_done_ < kSeparator.size() && rest[i] == kSeparator[sep_done_]) {
    ++i;
    ++sep_done_;
  }
  if (sep_done_ == kSeparator.size()) phase_ = Phase::kAnswer;
  if (i == rest.size()) return true;
  phase_ = Phase::kAnswer;  // the answer starts inside the closing token
  auto* grammar = dynamic_cast<GrammarConstraint*>(inner_.get());
  return grammar && grammar->accept_string(rest.substr(i));
}

bool ReasoningGate::accept(int32_t token) {
  switch (phase_) {
    case Phase::kStart:
      if (token == open_[0]) {
        opened_ = 1;
        phase_ = opened_ == open_.size() ? Phase::kReasoning : Phase::kOpening;
        return true;
      }
      phase_ = Phase::kAnswer;  // no reasoning block
      return inner_->accept(token);
    case Phase::kOpening:
      if (token != open_[opened_]) return false;
      if (++opened_ == open_.size()) phase_ = Phase::kReasoning;
      return true;
    case Phase::kReasoning: {
      tail_ += token_text(tok_, token);
      const size_t at = tail_.find(kClose);
      if (at != std::string::npos) {
        const std::string rest = tail_.substr(at + kClose.size());
        tail_.clear();
        return after_close(rest);
      }
      if (tail_.size() > 2 * kClose.size()) tail_.erase(0, tail_.size() - kClose.size());
      return true;
    }
    case Phase::kSeparator:
      for (int32_t id : separator_tokens())
        if (id == token) {
          for (const auto& [sid, text] : seps_)
            if (sid == token) sep_done_ += text.size();
          if (sep_done_ >= kSeparator.size()) phase_ = Phase::kAnswer;
          return true;
        }
      phase_ = Phase::kAnswer;  // the answer starts without (the rest of) the separator
      return inner_->accept(token);
    case Phase::kAnswer: return inner_->accept(token);
  }
  return false;
}

bool ReasoningGate::finished() const { return phase_ == Phase::kAnswer && inner_->finished(); }

}  // namespace ninfer
