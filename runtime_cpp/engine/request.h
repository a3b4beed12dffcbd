// A request as the engine sees it, and the channel between the HTTP thread that
// submitted it and the engine loop: the request, the events it produces (text deltas,
// then one kDone or kError), and the refusals Engine::submit throws.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/constraint.h"
#include "engine/sampling.h"

namespace ninfer {

struct GenerationRequest {
  std::string id;  // for the request log
  std::vector<int32_t> prompt;
  int max_tokens = -1;  // -1: as many as the context and the KV pool allow
  SamplingParams sampling;
  uint64_t seed = 0;  // choice i samples with seed + i
  std::vector<std::string> stop;
  bool ignore_eos = false;
  // Choices generated from the prompt (prefilled once, its KV blocks shared); each sends
  // its events with its index and ends with its own kDone. At most max_concurrency.
  int n = 1;
  // Until this many tokens were generated, the end-of-sequence ids (unless ignore_eos) and
  // stop_token_ids are masked and stop strings are not looked for (vLLM).
  int min_tokens = 0;
  // Sampling one of these ends the choice with "stop"; like an end-of-sequence token it is
  // counted in usage but not sent (neither text nor tokens).
  std::vector<int32_t> stop_token_ids;
  // >= 0: each sent token carries its logprob and this many top alternatives (0..20).
  int logprobs = -1;
  // Applied in order before sampling; choice 0's (the others get clones, constraint.h).
  TokenConstraints constraints;
};

struct Timings {
  int prompt_n = 0;
  int cache_n = 0;       // of them, found in the prefix cache (not computed)
  double prompt_ms = 0;  // first admitted -> first token
  int predicted_n = 0;
  double predicted_ms = 0;  // first token -> finished
  double queue_ms = 0;      // submitted -> first admitted
  // Speculative decoding (-1: off for this server): draft tokens verified, and accepted.
  int draft_n = -1;
  int draft_accepted_n = 0;
};

struct GenerationEvent {
  enum class Kind { kText, kDone, kError };
  Kind kind = Kind::kText;
  std::string text;                    // kText: the new text (complete UTF-8)
  int index = 0;                       // the choice (0..n-1) this event belongs to
  std::vector<int32_t> tokens;         // kText: tokens this delta completes
  std::vector<TokenLogprob> logprobs;  // kText with logprobs >= 0: one per token
  std::string finish_reason;           // kDone: "stop" | "length" | "cancelled" (per choice)
  std::string stop_sequence;           // kDone with "stop": the stop string that matched, if any
  std::string error;                   // kError
  std::string error_code;              // kError: "pending_timeout" (never admitted in time) or ""
  Timings timings;                     // kDone: of this choice
};

// Thrown by Engine::submit for a request that is refused without running.
class RequestRejected : public std::runtime_error {
 public:
  enum class Reason { kQueueFull, kContextLength, kKvCapacity, kShuttingDown };
  RequestRejected(Reason reason, const std::string& message, std::string param = "")
      : std::runtime_error(message), reason(reason), param(std::move(param)) {}
  // metric label: queue_full | context_length | kv_capacity | shutting_down
  static const char* name(Reason r);
  Reason reason;
  std::string param;  // "prompt" | "max_tokens" for the length checks
};

// Shared between the HTTP thread that submitted a request and the engine loop.
class RequestState {
 public:
  explicit RequestState(GenerationRequest r) : request(std::move(r)) {}
  // Blocks until the next event.
  GenerationEvent next();
  // Waits at most `timeout_ms` for the next event; false if none came.
  bool next_for(int timeout_ms, GenerationEvent& ev);
  // Waits at most `timeout_ms` until the request was admitted to run or has an event
  // (a request refused while queued gets an error event first); false on timeout.
  bool wait_started(int timeout_ms);
  bool started();
  void push(GenerationEvent ev);
  void mark_started();
  // Asks the engine to stop the request; it frees the request's slot and blocks within
  // one step and sends kDone with finish_reason "cancelled".
  void cancel() { cancelled.store(true); }

  const GenerationRequest request;
  std::atomic<bool> cancelled{false};
  // A consumer that only needs the final result (non-streaming) is woken for kDone and
  // kError only, not for every token: fewer context switches on a busy machine.
  std::atomic<bool> wake_per_token{true};
  double submitted_ms = 0;
  // [i]: choice i's constraints (Engine::submit; the engine loop takes them).
  std::vector<TokenConstraints> choice_constraints;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<GenerationEvent> events_;
  bool started_ = false;
};

}  // namespace ninfer
