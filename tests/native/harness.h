// Shared by the test cases of the test_engine binary (test_main.cpp lists them): the
// letters tokenizer of the fake model, collecting a request's events, reading a metric,
// the batching regimes of the invariance tests.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "check.h"
#include "engine/engine.h"
#include "fake_model.h"
#include "observe/metrics.h"
#include "text/tokenizer.h"

namespace ninfer::fake {

inline Tokenizer letters_tokenizer() { return Tokenizer::from_json(letters_tokenizer_json()); }

struct Outcome {
  std::string text;
  std::vector<int32_t> tokens;
  std::string finish;
  std::string error, error_code;
  Timings timings;
  bool operator==(const Outcome& o) const {
    return text == o.text && tokens == o.tokens && finish == o.finish && error == o.error;
  }
};

// Reads a request's events until kDone or kError. The wait is bounded only to turn a hang
// into a failure.
inline Outcome collect(RequestState& st) {
  Outcome o;
  for (;;) {
    GenerationEvent ev;
    CHECK(st.next_for(60000, ev));
    if (ev.kind == GenerationEvent::Kind::kError) {
      o.error = ev.error;
      o.error_code = ev.error_code;
      return o;
    }
    if (ev.kind == GenerationEvent::Kind::kDone) {
      o.finish = ev.finish_reason;
      o.timings = ev.timings;
      return o;
    }
    o.text += ev.text;
    o.tokens.insert(o.tokens.end(), ev.tokens.begin(), ev.tokens.end());
  }
}

// Reads events until every choice ended (kDone each) or an error came.
inline std::vector<Outcome> collect_choices(RequestState& st, int n) {
  std::vector<Outcome> out(n);
  int done = 0;
  while (done < n) {
    GenerationEvent ev;
    CHECK(st.next_for(60000, ev));
    CHECK(ev.index >= 0 && ev.index < n);
    Outcome& o = out[ev.index];
    if (ev.kind == GenerationEvent::Kind::kError) {
      for (Outcome& x : out) x.error = ev.error;
      return out;
    }
    if (ev.kind == GenerationEvent::Kind::kDone) {
      CHECK(o.finish.empty());  // one kDone per choice
      o.finish = ev.finish_reason;
      o.timings = ev.timings;
      ++done;
      continue;
    }
    CHECK(o.finish.empty());
    o.text += ev.text;
    o.tokens.insert(o.tokens.end(), ev.tokens.begin(), ev.tokens.end());
  }
  return out;
}

// The value of a sample in a Prometheus text page, e.g. "ninfer:kv_blocks_used".
inline double metric(const std::string& text, const std::string& name) {
  const std::string key = name + " ";
  size_t p = 0;
  while ((p = text.find(key, p)) != std::string::npos) {
    if (p == 0 || text[p - 1] == '\n') return std::atof(text.c_str() + p + key.size());
    p += key.size();
  }
  fail("metric " + name + " not found");
}

// A batching regime the invariance tests run a workload under (against the same workload
// run alone): engine concurrency and prefill chunk, the fake model's KV pool, and whether
// the pool is tight enough that requests must be preempted.
struct Regime {
  int concurrency, prefill_chunk, kv_blocks, block_size;
  bool expect_preemption;
};

// The engine options of `r`, no request left waiting for admission, metrics into `metrics`.
inline EngineOptions regime_options(const Regime& r, Metrics* metrics) {
  EngineOptions o;
  o.max_concurrency = r.concurrency;
  o.prefill_chunk = r.prefill_chunk;
  o.max_pending_requests = 0;
  o.metrics = metrics;
  return o;
}

// The cases, one per command-line word of test_engine.
void test_scheduler();
void test_invariance();
void test_cancel();
void test_admission();
void test_slowdown();
void test_sampling();
void test_stops();
void test_fork();
void test_token_controls();
void test_logits_processors();
void test_speculate();
void test_prefix();
void print_metrics();
void write_log(const std::string& path);

}  // namespace ninfer::fake
