// Internal to the engine (engine.cpp, engine_sampling.cpp, engine_spec.cpp): what the engine keeps
// per request and per choice. Not part of the engine's interface (engine.h).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/engine.h"
#include "engine/ngram.h"
#include "engine/stop_matcher.h"

namespace ninfer {

// What the n choices of one request share.
struct Engine::Choices {
  bool failed = false;  // an error was sent: the other choices end silently
};

// One choice of a request inside the engine: its scheduling state plus its own sampling
// and text state (choice i samples with seed + i).
struct Engine::Seq : Sequence {
  Seq(std::shared_ptr<RequestState> st, std::shared_ptr<Choices> c, int index, const Tokenizer& tok,
      int max_tokens)
      : state(std::move(st)), choices(std::move(c)), index(index),
        sampler(state->request.seed + static_cast<uint64_t>(index)), decoder(tok, true),
        stops(state->request.stop), max_tokens(max_tokens),
        constraints(std::move(state->choice_constraints.at(index))) {
    tokens = state->request.prompt;
    if (state->request.sampling.has_penalties()) counts.add_prompt(tokens);
  }
  std::shared_ptr<RequestState> state;
  std::shared_ptr<Choices> choices;
  int index;
  Sampler sampler;
  TokenCounts counts;  // for the penalties
  StreamDecoder decoder;
  StopMatcher stops;
  int max_tokens;
  TokenConstraints constraints;  // this choice's (request.h)
  int generated = 0;
  std::vector<int32_t> pending_tokens;  // sampled, not yet sent (held by the stop matcher)
  std::vector<TokenLogprob> pending_logprobs;
  double t_admit = -1, t_first = -1, t_last = -1;
  // Speculative decoding: the prompt-lookup index of `tokens` (null when off) and how
  // many drafts were verified and accepted.
  std::unique_ptr<Drafter> drafter;
  int draft_n = 0, draft_accepted_n = 0;

  int prompt_n() const { return static_cast<int>(state->request.prompt.size()); }
};

}  // namespace ninfer
