// Server metrics in the Prometheus text exposition format (GET /metrics). Names follow
// vLLM's where vLLM has one, with `ninfer:` in place of `vllm:`. Thread-safe: the engine
// loop and the HTTP threads update, scrapes read.
//
//   ninfer:num_requests_running            gauge      requests holding a sequence slot
//   ninfer:num_requests_waiting            gauge      requests queued (new or preempted)
//   ninfer:kv_blocks_used / _total         gauge      KV pool blocks (block 0 not counted)
//   ninfer:kv_cache_usage_perc             gauge      used / total, a fraction (1 = full), as vLLM
//   ninfer:prompt_tokens_total             counter    prompt tokens prefilled (not recomputation)
//   ninfer:generation_tokens_total         counter    tokens sampled
//   ninfer:num_preemptions_total           counter    sequences preempted for KV blocks
//   ninfer:request_success_total{finished_reason="stop"|"length"}  counter
//   ninfer:requests_rejected_total{reason="queue_full"|"context_length"|"kv_capacity"|
//                                  "pending_timeout"}               counter
//   ninfer:requests_cancelled_total        counter    stopped because the client went away
//   ninfer:time_to_first_token_seconds     histogram  arrival -> first token
//   ninfer:inter_token_latency_seconds     histogram  gap between consecutive tokens of a
//                                                     request (vLLM V1's name; its older
//                                                     time_per_output_token_seconds)
//   ninfer:e2e_request_latency_seconds     histogram  arrival -> finished
//   ninfer:request_queue_time_seconds      histogram  arrival -> first admitted
//   ninfer:request_prefill_time_seconds    histogram  admitted -> first token
//   ninfer:request_decode_time_seconds     histogram  first token -> finished
//   ninfer:iteration_tokens_total          histogram  rows per engine step
// With prefix caching (set_prefix_cache; vLLM's names):
//   ninfer:prefix_cache_queries_total      counter    prompt tokens looked up at admissions
//   ninfer:prefix_cache_hits_total         counter    of them, found cached
//   ninfer:prefix_cache_blocks             gauge      KV blocks holding cached content
//   ninfer:prefix_cache_evictions_total    counter    cached blocks reused for new content
//   ninfer:state_checkpoints_used / _total gauge      recurrent-state checkpoint slots
// With speculative decoding (enable_spec; vLLM's spec_decode_* names):
//   ninfer:spec_decode_num_drafts_total              counter  draft proposals verified
//                                                             (a sequence's drafts in a step)
//   ninfer:spec_decode_num_draft_tokens_total        counter  draft tokens verified
//   ninfer:spec_decode_num_accepted_tokens_total     counter  draft tokens accepted
//   ninfer:spec_decode_num_accepted_tokens_per_pos_total{position="0".."K-1"}  counter
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace ninfer {

class Metrics {
 public:
  Metrics();

  void set_requests(int running, int waiting);
  void set_kv_blocks(int used, int total);
  // Recurrent-state slots in use / in all (hybrid models; absent from /metrics otherwise).
  void set_state_slots(int used, int total);
  void add_prompt_tokens(int n);
  void add_generation_tokens(int n);
  void add_preemptions(int n);
  void request_finished(const std::string& finish_reason);  // "stop" | "length"
  void request_rejected(const std::string& reason);
  void request_cancelled();
  void observe_ttft(double seconds);
  void observe_inter_token(double seconds);
  void observe_e2e(double seconds);
  void observe_queue(double seconds);
  void observe_prefill(double seconds);
  void observe_decode(double seconds);
  void observe_step_rows(int rows);
  // Sequences in one step (decode rows and prompt chunks): > 1 when requests overlap.
  void observe_step_sequences(int n);
  // CUDA graphs of the process: instantiated and launched (absent from /metrics until set;
  // the server sets them on a CUDA backend, graphs on or off).
  void set_cuda_graphs(uint64_t captured, uint64_t replays);
  // Prefix caching (absent from /metrics while it is off): prompt tokens looked up in the
  // cache at admissions and found there (vLLM's prefix_cache_queries / _hits), blocks
  // cached and evicted; with recurrent state, checkpoint slots holding a state.
  void set_prefix_cache(uint64_t queries, uint64_t hits, int cached_blocks, uint64_t evictions);
  void set_state_checkpoints(int used, int total);
  // Speculative decoding with up to `max_drafts` drafts per proposal: its counters appear.
  void enable_spec(int max_drafts);
  // A verify step of a sequence with drafts (one proposal), then each draft it decided
  // (the one at `position` in the proposal), as it is decided: a response that a finishing
  // token sends at once already finds its drafts in the counters.
  void observe_proposal();
  void observe_draft(int position, bool accepted);

  std::string render() const;  // text format 0.0.4
  static const char* content_type() { return "text/plain; version=0.0.4; charset=utf-8"; }

 private:
  struct Histogram {
    std::vector<double> bounds;    // upper bounds, ascending; +Inf implied
    std::vector<uint64_t> counts;  // per bucket, not cumulative; last = +Inf
    double sum = 0;
    uint64_t count = 0;
    void observe(double v);
  };
  struct Family {
    std::string name, help, type;          // type: counter | gauge | histogram
    std::string label;                     // label name of a labelled counter, else empty
    std::map<std::string, double> values;  // label value ("" unlabelled) -> value
    Histogram hist;
  };
  Family& family(const std::string& name);
  Family& lazy(const char* name, const char* type, const char* help);
  void add(const std::string& name, const std::string& label_value, double v);
  void set(const std::string& name, double v);
  void observe(const std::string& name, double v);

  mutable std::mutex mu_;
  std::vector<Family> families_;  // exposition order
};

}  // namespace ninfer
