// Where speculative decoding's drafts come from, per sequence: the engine appends every
// token the sequence holds (its prompt, then each accepted token) and asks for up to k
// tokens to follow them before each step. Drafts only have to be cheap to propose: the
// verification keeps the output exact whatever they are. NgramDrafter (ngram.h) is the
// server's; tests plug in others (EngineOptions::drafter).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace ninfer {

class Drafter {
 public:
  virtual ~Drafter() = default;
  virtual void append(int32_t token) = 0;
  void extend(const std::vector<int32_t>& tokens) {
    for (int32_t t : tokens) append(t);
  }
  // Up to k (>= 0) tokens proposed for the positions after the last one appended.
  virtual std::vector<int32_t> propose(int k) const = 0;
};

// --spec mtp: the drafts the model's MTP head proposed after the last step
// (Engine::draft_mtp), forgotten when a token is appended (they followed the tokens
// before it).
class HeldDrafter final : public Drafter {
 public:
  void append(int32_t) override { held_.clear(); }
  std::vector<int32_t> propose(int k) const override {
    const size_t n = std::min(held_.size(), static_cast<size_t>(std::max(k, 0)));
    return {held_.begin(), held_.begin() + static_cast<std::ptrdiff_t>(n)};
  }
  void hold(std::vector<int32_t> drafts) { held_ = std::move(drafts); }

 private:
  std::vector<int32_t> held_;
};

}  // namespace ninfer
