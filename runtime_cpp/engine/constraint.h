// What may come next in a request's output, beyond sampling: a grammar (structured output,
// required tool calls) or a forced sequence (a thinking budget closing its block). The
// engine owns no constraint logic; it asks each of a request's constraints, in order,
// before and after every sampled token.
//
// Per token, on the engine thread unless noted:
//   1. prepare()        right after the step that produces the logits is launched, so a
//                       constraint can compute its next mask while the model runs (it may
//                       hand the work to another thread and join in apply());
//   2. apply(logits)    sets the logit of every token it forbids to -infinity; or, when
//      fill_bitmask()   the model samples on the device, clears the bit of every token it
//                       forbids (bit t % 32 of word t / 32, xgrammar's layout);
//   3. accept(token)    the sampled token; returns false if the constraint cannot take it
//                       (the engine then fails the request: a bug, never silent);
//   4. finished()       true when nothing more may follow (a complete grammar): the engine
//                       ends the request with finish_reason "stop".
// A constraint that forbids every token makes the engine fail the request.
//
// A request's constraints are those of its first choice; each other choice (n > 1) gets
// clone()s of them, made by Engine::submit before any token: an independent copy in the
// same state. A constraint that returns null cannot serve several choices, and a request
// with n > 1 is then refused.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

namespace ninfer {

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  virtual void prepare() {}
  virtual void apply(float* logits, int vocab) = 0;
  // The default runs apply() on a scratch row; a constraint that has a bitmask (the
  // grammar) ANDs it in directly.
  virtual void fill_bitmask(uint32_t* words, int vocab) {
    std::vector<float> row(static_cast<size_t>(vocab), 0.0f);
    apply(row.data(), vocab);
    for (int id = 0; id < vocab; ++id)
      if (row[id] == -std::numeric_limits<float>::infinity()) words[id / 32] &= ~(1u << (id % 32));
  }
  virtual bool accept(int32_t token) = 0;
  virtual bool finished() const { return false; }
  virtual std::shared_ptr<TokenConstraint> clone() { return nullptr; }
};

using TokenConstraints = std::vector<std::shared_ptr<TokenConstraint>>;

}  // namespace ninfer
