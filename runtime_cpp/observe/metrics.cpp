#include "observe/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace ninfer {

namespace {

// Prometheus sample value: integers without a fraction, others with full precision.
std::string number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  if (v == std::floor(v) && std::fabs(v) < 1e15) std::snprintf(buf, sizeof buf, "%.1f", v);
  else std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// Bucket bounds: vLLM's, with sub-10 ms steps added for small models on fast hardware.
const std::vector<double> kTtftBuckets = {0.001, 0.005, 0.01, 0.02,  0.04,  0.06,  0.08, 0.1,
                                          0.25,  0.5,   0.75, 1.0,   2.5,   5.0,   7.5,  10.0,
                                          20.0,  40.0,  80.0, 160.0, 640.0, 2560.0};
const std::vector<double> kItlBuckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1,
                                         0.15,  0.2,    0.3,   0.4,  0.5,   0.75, 1.0,   2.5,
                                         5.0,   7.5,    10.0,  20.0, 40.0,  80.0};
const std::vector<double> kRequestBuckets = {
    0.01, 0.05, 0.1,  0.3,  0.5,  0.8,  1.0,   1.5,   2.0,   2.5,   5.0,    10.0,
    15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
const std::vector<double> kStepBuckets = {1,   8,    16,   32,   64,   128,  256,
                                          512, 1024, 2048, 4096, 8192, 16384};
const std::vector<double> kSeqBuckets = {1, 2, 4, 8, 16, 32, 64, 128, 256};

}  // namespace

void Metrics::Histogram::observe(double v) {
  const size_t i = std::lower_bound(bounds.begin(), bounds.end(), v) - bounds.begin();
  ++counts[i];  // le is inclusive: v == bound falls in that bucket
  sum += v;
  ++count;
}

Metrics::Metrics() {
  auto scalar = [&](const char* name, const char* type, const char* help) {
    Family f;
    f.name = name;
    f.type = type;
    f.help = help;
    f.values[""] = 0;
    families_.push_back(std::move(f));
  };
  auto labelled = [&](const char* name, const char* label, std::vector<std::string> values,
                      const char* help) {
    Family f;
    f.name = name;
    f.type = "counter";
    f.help = help;
    f.label = label;
    for (const auto& v : values) f.values[v] = 0;  // every known series present from the start
    families_.push_back(std::move(f));
  };
  auto histogram = [&](const char* name, const std::vector<double>& bounds, const char* help) {
    Family f;
    f.name = name;
    f.type = "histogram";
    f.help = help;
    f.hist.bounds = bounds;
    f.hist.counts.assign(bounds.size() + 1, 0);
    families_.push_back(std::move(f));
  };
  scalar("ninfer:num_requests_running", "gauge", "Number of requests holding a sequence slot.");
  scalar("ninfer:num_requests_waiting", "gauge",
         "Number of requests waiting for a slot or KV blocks (new or preempted).");
  scalar("ninfer:kv_blocks_used", "gauge", "KV cache blocks in use.");
  scalar("ninfer:kv_blocks_total", "gauge",
         "KV cache blocks in the pool (the reserved block 0 excluded).");
  scalar("ninfer:kv_cache_usage_perc", "gauge", "KV cache usage. 1 means 100 percent usage.");
  scalar("ninfer:prompt_tokens_total", "counter", "Number of prefill tokens processed.");
  scalar("ninfer:generation_tokens_total", "counter", "Number of generation tokens processed.");
  scalar("ninfer:num_preemptions_total", "counter", "Cumulative number of preemptions.");
  labelled("ninfer:request_success_total", "finished_reason", {"stop", "length"},
           "Count of successfully processed requests.");
  labelled("ninfer:requests_rejected_total", "reason",
           {"queue_full", "context_length", "kv_capacity", "pending_timeout"},
           "Requests refused without being run.");
  scalar("ninfer:requests_cancelled_total", "counter",
         "Requests stopped because the client disconnected.");
  histogram("ninfer:time_to_first_token_seconds", kTtftBuckets,
            "Histogram of time to first token in seconds.");
  histogram("ninfer:inter_token_latency_seconds", kItlBuckets,
            "Histogram of inter-token latency in seconds.");
  histogram("ninfer:e2e_request_latency_seconds", kRequestBuckets,
            "Histogram of e2e request latency in seconds.");
  histogram("ninfer:request_queue_time_seconds", kRequestBuckets,
            "Histogram of time spent in the waiting queue before first admission in seconds.");
  histogram("ninfer:request_prefill_time_seconds", kRequestBuckets,
            "Histogram of time from admission to the first token in seconds.");
  histogram("ninfer:request_decode_time_seconds", kRequestBuckets,
            "Histogram of time from the first token to the end in seconds.");
  histogram("ninfer:iteration_tokens_total", kStepBuckets,
            "Histogram of number of tokens per engine step.");
  histogram("ninfer:iteration_sequences", kSeqBuckets,
            "Histogram of number of sequences per engine step.");
}

Metrics::Family& Metrics::family(const std::string& name) {
  for (Family& f : families_)
    if (f.name == name) return f;
  throw std::logic_error("unknown metric " + name);
}

void Metrics::add(const std::string& name, const std::string& label_value, double v) {
  std::lock_guard<std::mutex> lock(mu_);
  family(name).values[label_value] += v;
}

void Metrics::set(const std::string& name, double v) {
  std::lock_guard<std::mutex> lock(mu_);
  family(name).values[""] = v;
}

void Metrics::observe(const std::string& name, double v) {
  std::lock_guard<std::mutex> lock(mu_);
  family(name).hist.observe(v);
}

void Metrics::set_requests(int running, int waiting) {
  std::lock_guard<std::mutex> lock(mu_);
  family("ninfer:num_requests_running").values[""] = running;
  family("ninfer:num_requests_waiting").values[""] = waiting;
}

void Metrics::set_kv_blocks(int used, int total) {
  std::lock_guard<std::mutex> lock(mu_);
  family("ninfer:kv_blocks_used").values[""] = used;
  family("ninfer:kv_blocks_total").values[""] = total;
  family("ninfer:kv_cache_usage_perc").values[""] = total > 0 ? double(used) / total : 0.0;
}

// The family `name` (appended on first use: families that only some models or backends
// have stay out of /metrics until then). Called with mu_ held.
Metrics::Family& Metrics::lazy(const char* name, const char* type, const char* help) {
  for (Family& f : families_)
    if (f.name == name) return f;
  Family f;
  f.name = name;
  f.type = type;
  f.help = help;
  families_.push_back(std::move(f));
  return families_.back();
}

void Metrics::set_state_slots(int used, int total) {
  std::lock_guard<std::mutex> lock(mu_);
  lazy("ninfer:state_slots_used", "gauge",
       "Recurrent-state slots (Gated DeltaNet conv and SSM state) in use.")
      .values[""] = used;
  lazy("ninfer:state_slots_total", "gauge",
       "Recurrent-state slots of the compiled model (one per sequence slot).")
      .values[""] = total;
}

void Metrics::add_prompt_tokens(int n) { add("ninfer:prompt_tokens_total", "", n); }
void Metrics::add_generation_tokens(int n) { add("ninfer:generation_tokens_total", "", n); }
void Metrics::add_preemptions(int n) { add("ninfer:num_preemptions_total", "", n); }
void Metrics::request_finished(const std::string& reason) {
  add("ninfer:request_success_total", reason, 1);
}
void Metrics::request_rejected(const std::string& reason) {
  add("ninfer:requests_rejected_total", reason, 1);
}
void Metrics::request_cancelled() { add("ninfer:requests_cancelled_total", "", 1); }
void Metrics::observe_ttft(double s) { observe("ninfer:time_to_first_token_seconds", s); }
void Metrics::observe_inter_token(double s) { observe("ninfer:inter_token_latency_seconds", s); }
void Metrics::observe_e2e(double s) { observe("ninfer:e2e_request_latency_seconds", s); }
void Metrics::observe_queue(double s) { observe("ninfer:request_queue_time_seconds", s); }
void Metrics::observe_prefill(double s) { observe("ninfer:request_prefill_time_seconds", s); }
void Metrics::observe_decode(double s) { observe("ninfer:request_decode_time_seconds", s); }
void Metrics::observe_step_rows(int rows) { observe("ninfer:iteration_tokens_total", rows); }
void Metrics::observe_step_sequences(int n) { observe("ninfer:iteration_sequences", n); }

void Metrics::set_cuda_graphs(uint64_t captured, uint64_t replays) {
  std::lock_guard<std::mutex> lock(mu_);
  lazy("ninfer:cuda_graphs_captured_total", "counter",
       "CUDA graphs instantiated (one per step shape, from its second run).")
      .values[""] = static_cast<double>(captured);
  lazy("ninfer:cuda_graph_replays_total", "counter", "Steps launched as CUDA graph replays.")
      .values[""] = static_cast<double>(replays);
}

void Metrics::set_prefix_cache(uint64_t queries, uint64_t hits, int cached_blocks,
                               uint64_t evictions) {
  std::lock_guard<std::mutex> lock(mu_);
  lazy("ninfer:prefix_cache_queries_total", "counter",
       "Prompt tokens looked up in the prefix cache when a sequence was admitted.")
      .values[""] = static_cast<double>(queries);
  lazy("ninfer:prefix_cache_hits_total", "counter",
       "Prompt tokens found in the prefix cache (not computed) when a sequence was admitted.")
      .values[""] = static_cast<double>(hits);
  lazy("ninfer:prefix_cache_blocks", "gauge",
       "KV cache blocks holding published (reusable) prefix content, in use or not.")
      .values[""] = cached_blocks;
  lazy("ninfer:prefix_cache_evictions_total", "counter",
       "Cached KV blocks evicted (least recently used first) for new content.")
      .values[""] = static_cast<double>(evictions);
}

void Metrics::set_state_checkpoints(int used, int total) {
  std::lock_guard<std::mutex> lock(mu_);
  lazy("ninfer:state_checkpoints_used", "gauge",
       "Recurrent-state checkpoint slots holding the state after a cached prefix.")
      .values[""] = used;
  lazy("ninfer:state_checkpoints_total", "gauge",
       "Recurrent-state checkpoint slots of the compiled model (--state-checkpoints).")
      .values[""] = total;
}

void Metrics::enable_spec(int max_drafts) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const Family& f : families_)
    if (f.name == "ninfer:spec_decode_num_drafts_total") return;
  auto counter = [&](const char* name, const char* help, const char* label, int values) {
    Family f;
    f.name = name;
    f.type = "counter";
    f.help = help;
    f.label = label;
    if (values == 0) f.values[""] = 0;
    for (int i = 0; i < values; ++i) f.values[std::to_string(i)] = 0;
    families_.push_back(std::move(f));
  };
  counter("ninfer:spec_decode_num_drafts_total", "Number of spec decoding drafts.", "", 0);
  counter("ninfer:spec_decode_num_draft_tokens_total", "Number of draft tokens.", "", 0);
  counter("ninfer:spec_decode_num_accepted_tokens_total", "Number of accepted tokens.", "", 0);
  counter("ninfer:spec_decode_num_accepted_tokens_per_pos_total",
          "Accepted tokens per draft position.", "position", max_drafts);
}

void Metrics::observe_proposal() {
  std::lock_guard<std::mutex> lock(mu_);
  family("ninfer:spec_decode_num_drafts_total").values[""] += 1;
}

void Metrics::observe_draft(int position, bool accepted) {
  std::lock_guard<std::mutex> lock(mu_);
  family("ninfer:spec_decode_num_draft_tokens_total").values[""] += 1;
  if (!accepted) return;
  family("ninfer:spec_decode_num_accepted_tokens_total").values[""] += 1;
  family("ninfer:spec_decode_num_accepted_tokens_per_pos_total").values[std::to_string(position)] +=
      1;
}

std::string Metrics::render() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  for (const Family& f : families_) {
    out += "# HELP " + f.name + " " + f.help + "\n";
    out += "# TYPE " + f.name + " " + f.type + "\n";
    if (f.type == "histogram") {
      const Histogram& h = f.hist;
      uint64_t cum = 0;
      for (size_t i = 0; i <= h.bounds.size(); ++i) {
        cum += h.counts[i];
        const std::string le = i < h.bounds.size() ? number(h.bounds[i]) : "+Inf";
        out += f.name + "_bucket{le=\"" + le + "\"} " + number(double(cum)) + "\n";
      }
      out += f.name + "_sum " + number(h.sum) + "\n";
      out += f.name + "_count " + number(double(h.count)) + "\n";
      continue;
    }
    for (const auto& [label_value, v] : f.values) {
      // Label values here are fixed identifiers; no escaping is needed.
      const std::string labels = f.label.empty() ? "" : "{" + f.label + "=\"" + label_value + "\"}";
      out += f.name + labels + " " + number(v) + "\n";
    }
  }
  return out;
}

}  // namespace ninfer
