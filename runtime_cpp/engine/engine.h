// The engine: one loop thread that owns the model and runs continuous batching; requests
// arrive through a queue and results leave through a per-request channel, so the HTTP
// threads never touch the model and the model never sees JSON.
//
// Each loop iteration reaps cancelled and timed-out requests, asks the Scheduler
// (scheduler.h) for a step plan (decode rows of running requests, then prompt chunks,
// under the step token budget), runs Model::step over it, and samples the requests whose
// last row was in the step. Each request owns its Sampler (seeded per request),
// StreamDecoder and StopMatcher, and the kernels are row-independent, so a request's
// tokens do not depend on what else is in the batch, on how its prompt was chunked, or
// on being preempted and recomputed.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "model/model.h"
#include "engine/sampling.h"
#include "engine/scheduler.h"
#include "text/tokenizer.h"

namespace ninfer {

class Metrics;
class RequestLog;

struct GenerationRequest {
  std::string id;                // for the request log
  std::vector<int32_t> prompt;
  int max_tokens = -1;           // -1: as many as the context and the KV pool allow
  SamplingParams sampling;
  uint64_t seed = 0;
  std::vector<std::string> stop;
  bool ignore_eos = false;
};

struct Timings {
  int prompt_n = 0;
  double prompt_ms = 0;     // first admitted -> first token
  int predicted_n = 0;
  double predicted_ms = 0;  // first token -> finished
  double queue_ms = 0;      // submitted -> first admitted
};

struct GenerationEvent {
  enum class Kind { kText, kDone, kError };
  Kind kind = Kind::kText;
  std::string text;              // kText: the new text (complete UTF-8)
  std::vector<int32_t> tokens;   // kText: tokens this delta completes
  std::string finish_reason;     // kDone: "stop" | "length" | "cancelled"
  std::string error;             // kError
  std::string error_code;        // kError: "pending_timeout" (never admitted in time) or ""
  Timings timings;               // kDone
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

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<GenerationEvent> events_;
  bool started_ = false;
};

struct EngineOptions {
  int context_limit = 0;          // tokens per request (prompt + generated); 0: compiled
  int max_concurrency = 0;        // requests running at once (<= step_tokens);
                                  // 0: compiled, at most step_tokens
  int step_tokens = 0;            // rows per step (--prefill-chunk); 0: compiled
  int max_pending = 64;           // requests waiting for a slot; 0: unbounded
  double pending_timeout_ms = 0;  // a request not admitted within this fails; 0: never
  // While requests decode, a step's prompt rows are limited so that the step takes at
  // most this many times a decode-only step (both measured online); 0: no limit.
  double max_decode_slowdown = 1.5;
  Metrics* metrics = nullptr;         // optional
  RequestLog* request_log = nullptr;  // optional
};

class Engine {
 public:
  Engine(Model& model, const Tokenizer& tokenizer, std::vector<int32_t> eos_ids,
         const EngineOptions& options);
  ~Engine();
  // Stops serving: every request in flight or waiting ends with an error event (code
  // "shutting_down") within one step, and later submits are refused. Any thread.
  void shutdown();
  // Queues a request. Throws RequestRejected when it can never fit (context, KV pool) or
  // the waiting queue is full; std::invalid_argument for an empty prompt.
  std::shared_ptr<RequestState> submit(GenerationRequest request);
  const ModelInfo& info() const { return model_.info(); }
  int context_limit() const { return context_limit_; }
  int max_concurrency() const { return sched_config_.max_concurrency; }
  int step_tokens() const { return sched_config_.step_tokens; }
  int kv_blocks_total() const { return sched_config_.kv_blocks - 1; }
  int max_positions() const { return max_positions_; }  // per request, KV pool bound

 private:
  struct Seq;
  void loop();
  void reap(double now);
  void run_step(StepPlan& plan);
  bool on_token(Seq& s, const float* logits, double now);  // true: finished
  void finish(Seq& s, const std::string& reason, double now);
  void fail(Seq& s, const std::string& error, const std::string& code, double now);
  void drop(Seq& s);
  void publish();
  void log_rejected(const GenerationRequest& r, int max_tokens, const std::string& reason,
                    const std::string& message);

  Model& model_;
  const Tokenizer& tokenizer_;
  std::vector<int32_t> eos_ids_;
  SchedulerConfig sched_config_;
  int context_limit_;
  int max_positions_;
  int max_pending_;
  double pending_timeout_ms_;
  double max_decode_slowdown_;
  Metrics* metrics_;
  RequestLog* log_;

  // Loop thread only.
  Scheduler sched_;
  std::vector<std::unique_ptr<Seq>> seqs_;
  std::vector<float> logits_;
  std::vector<int32_t> tokens_, positions_, slots_, block_tables_, logit_rows_;
  // Step cost model for max_decode_slowdown: a decode-only step, and each prompt row
  // on top of one (exponential moving averages of measured step times).
  double decode_step_ms_ = 0, prompt_row_ms_ = 0;
  int prefill_limit() const;

  std::mutex mu_;  // guards the fields below
  std::condition_variable cv_;
  std::deque<std::shared_ptr<RequestState>> incoming_;
  int waiting_ = 0;     // in the scheduler's queue, as last published by the loop
  int free_slots_ = 0;  // as last published by the loop
  bool stopping_ = false;
  bool shutting_down_ = false;  // under mu_: refuse submits, fail what is in flight
  std::thread thread_;
};

double now_ms();

}  // namespace ninfer
