// The engine: one loop thread that owns the model and runs continuous batching; requests
// arrive through a queue and results leave through a per-request channel, so the HTTP
// threads never touch the model and the model never sees JSON.
//
// Requests and their events are in request.h; Engine::submit (admission.cpp) refuses
// what can never fit. Each loop iteration (engine.cpp) reaps cancelled and timed-out
// requests, asks the Scheduler (scheduler.h) for a step plan (decode rows of running
// requests, then prompt chunks, under the step token budget), runs Model::step over it,
// and samples the requests whose last row was in the step: on the host (sampling.h) over
// the logits the step returns, or, for a model that samples on the device
// (Model::samples_on_device, CUDA), by describing each row's sampling (SampleRow: its
// parameters, logit edits and constraint bitmask) for Model::sample; everything after the
// token is chosen is one code path. Each request owns its Sampler
// (seeded per request), StreamDecoder and StopMatcher, and the kernels are
// row-independent, so a request's tokens do not depend on what else is in the batch, on
// how its prompt was chunked, or on being preempted and recomputed. A request with n > 1
// runs as n sequences (its choices; the scheduler shares the prompt's KV blocks between
// them), choice i seeded with seed + i: it gives the same choices as n requests with
// seeds seed, seed + 1, ... would.
//
// Speculative decoding (EngineOptions::draft_tokens > 0, a model compiled with --spec
// ngram): before each plan every decoding sequence proposes up to draft_tokens tokens by
// prompt lookup (ngram.h) over its own prompt and output; the step computes them as extra
// rows after its last token, with logits for each, and the engine verifies them in order
// (Sampler::verify after the request's processors, exactly as a non-speculative step
// would have processed each position): accepted drafts become tokens (their keys and
// values are kept), the first rejected one is replaced by the verifier's token and the
// rows after it are dropped (drop_rejected: their blocks leave the table); when all are
// accepted the last row's logits give one more token. A certain draft is accepted iff
// the position's own draw equals it, so requests, greedy or seeded, produce exactly the
// tokens they would without speculation. On a model that samples on the device each
// draft row is described as the position after the drafts before it (device_row's j).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/clock.h"
#include "engine/drafter.h"
#include "engine/request.h"
#include "engine/sampling.h"
#include "engine/scheduler.h"
#include "model/model.h"
#include "text/tokenizer.h"

namespace ninfer {

class Metrics;
class RequestLog;

struct EngineOptions {
  int max_context = 0;            // tokens per request (prompt + generated); 0: compiled
  int max_concurrency = 0;        // requests running at once (<= prefill_chunk);
                                  // 0: compiled, at most prefill_chunk
  int prefill_chunk = 0;          // rows per step (--prefill-chunk); 0: compiled
  int max_pending_requests = 64;  // requests waiting for a slot; 0: unbounded
  double pending_timeout_ms = 0;  // a request not admitted within this fails; 0: never
  // While requests decode, a step's prompt rows are limited so that the step takes at
  // most this many times a decode-only step (both measured online); 0: no limit.
  double max_decode_slowdown = 1.5;
  Metrics* metrics = nullptr;         // optional
  RequestLog* request_log = nullptr;  // optional
  // What the engine measures time with (clock.h); nullptr: steady_clock().
  const Clock* clock = nullptr;
  // Speculative decoding: drafts per sequence and step (0: off; at most the compiled
  // ModelInfo::max_draft_tokens), proposed by n-gram lookup of ngram_min..ngram_max tokens.
  int draft_tokens = 0;
  int ngram_min = 2;
  int ngram_max = 4;
  // Prefix caching (scheduler.h): reuse the KV blocks (and, with recurrent state, the
  // state checkpoints) of earlier requests' prompts. checkpoint_interval > 0: also
  // checkpoint a long prompt's state every this many positions (a multiple of
  // Scheduler::checkpoint_granularity()).
  bool prefix_caching = true;
  int checkpoint_interval = 0;
  // Tests: another source of drafts for choice `index` of a request (empty: n-gram lookup).
  std::function<std::unique_ptr<Drafter>(const GenerationRequest&, int index)> drafter;
};

class Engine {
 public:
  static constexpr int kMaxLogprobs = 20;  // top alternatives per token, at most
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
  int max_context() const { return max_context_; }
  int max_concurrency() const { return sched_config_.max_concurrency; }
  int prefill_chunk() const { return sched_config_.prefill_chunk; }
  int kv_blocks_total() const { return sched_config_.kv_blocks - 1; }
  int max_positions() const { return max_positions_; }  // per request, KV pool bound

 private:
  struct Seq;
  struct Choices;
  void loop();
  void reap(double now);
  void run_step(StepPlan& plan);
  // The token chosen for s (and its logprobs when asked): accept it, send, stop or go on.
  // first_in_step: the first of the tokens a step gave s (the others, accepted drafts, add
  // no inter-token latency sample: vLLM's one per step).
  bool on_token(Seq& s, int32_t token, TokenLogprob* logprob, double now,
                bool first_in_step = true);  // true: finished
  // The host path over one logits row: processors, then a draw, or with `draft` the
  // verification of that draft (*accepted says whether it was).
  int32_t sample_host(Seq& s, float* logits, TokenLogprob* logprob, const int32_t* draft = nullptr,
                      bool* accepted = nullptr);
  void propose_drafts();
  // --spec mtp, after a step's tokens are decided: the model's draft head over the step's
  // rows (each with its sequence's next token) fills its own keys/values and proposes
  // the drafts of every sequence that decodes next (held by its HeldDrafter).
  void draft_mtp(const StepPlan& plan);
  // Verifies s's drafts against logits rows [first, first + s.drafts.size()] (on the host,
  // or with `errors` the device's sampled rows and their description errors) and emits the
  // tokens; true when s finished (and is gone).
  bool verify_drafts(Seq& s, int first, double now,
                     const std::vector<std::string>* errors = nullptr);
  void process_logits(Seq& s, float* logits);
  void device_row(Seq& s, int k, int j = 0);  // fills sample_rows_[k] (j: draft row)
  void send_pending(Seq& s, const std::string& text);
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
  int max_context_;
  int max_positions_;
  int max_pending_requests_;
  double pending_timeout_ms_;
  double max_decode_slowdown_;
  int draft_tokens_;
  int ngram_min_, ngram_max_;
  std::function<std::unique_ptr<Drafter>(const GenerationRequest&, int)> make_drafter_;
  Metrics* metrics_;
  RequestLog* log_;
  const Clock& clock_;

  // Loop thread only.
  Scheduler sched_;
  std::vector<std::unique_ptr<Seq>> seqs_;
  std::vector<float> logits_;
  std::vector<float> raw_logits_;  // a row before its processors, for logprobs
  // Device sampling: per logits row of the step, its description and result.
  std::vector<SampleRow> sample_rows_;
  std::vector<std::vector<SampleEdit>> sample_edits_;
  std::vector<std::vector<uint32_t>> sample_masks_;
  std::vector<SampledToken> sampled_;
  std::unordered_map<int32_t, int> edit_index_;  // token -> its edit in the row being built
  std::vector<int32_t> tokens_, positions_, slots_, block_tables_, logit_rows_;
  std::vector<int32_t> state_slots_, save_slots_;  // models with recurrent state
  bool mtp_ = false;  // drafts from the model's MTP head (ModelInfo::spec "mtp")
  std::vector<int32_t> draft_next_, draft_rows_, draft_counts_, draft_out_;
  std::vector<Seq*> draft_seqs_;
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

}  // namespace ninfer
