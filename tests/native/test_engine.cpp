// The Engine against the fake model: batch invariance, cancellation, admission control,
// the decode-slowdown cap, and the metrics page and request log the Python side parses.
//
// Where a case depends on how far a request got, a Gate holds the model's steps, so the
// test acts at a known step; where it depends on time, the engine measures a FakeClock
// that only the model's modelled step costs advance. Nothing here races the machine.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "harness.h"
#include "observe/metrics.h"
#include "observe/request_log.h"

namespace ninfer::fake {
namespace {

std::vector<GenerationRequest> workload() {
  std::vector<GenerationRequest> reqs;
  std::mt19937 rng(7);
  for (int i = 0; i < 14; ++i) {
    GenerationRequest r;
    r.id = "req-" + std::to_string(i);
    const int n = 1 + rng() % 30;
    for (int t = 0; t < n; ++t) r.prompt.push_back(rng() % 26);
    r.max_tokens = 4 + rng() % 24;
    r.seed = 1000 + i;
    if (i % 3 == 0) r.sampling.temperature = 0;  // greedy
    if (i % 4 == 1) r.sampling.top_k = 5;
    if (i % 5 == 2) r.stop = {"q", "e", "x"};
    r.ignore_eos = i % 2 == 0;
    reqs.push_back(r);
  }
  return reqs;
}

std::vector<Outcome> run_all(Engine& engine, const std::vector<GenerationRequest>& reqs,
                             bool together) {
  std::vector<Outcome> out(reqs.size());
  if (!together) {
    for (size_t i = 0; i < reqs.size(); ++i) out[i] = collect(*engine.submit(reqs[i]));
    return out;
  }
  std::vector<std::shared_ptr<RequestState>> states;
  for (const auto& r : reqs) states.push_back(engine.submit(r));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < reqs.size(); ++i)
    threads.emplace_back([&, i] { out[i] = collect(*states[i]); });
  for (auto& t : threads) t.join();
  return out;
}

GenerationRequest long_request(const std::string& id, int max_tokens) {
  GenerationRequest r;
  r.id = id;
  r.prompt = {1, 2, 3};
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  return r;
}

}  // namespace

void test_invariance() {
  const Tokenizer tok = letters_tokenizer();
  const auto reqs = workload();
  // Solo: one request at a time, room for everything.
  FakeModel solo_model(4, 16, 1 + 4 * 16, 4, 64);
  EngineOptions solo_opts;
  solo_opts.max_concurrency = 1;
  std::vector<Outcome> solo;
  {
    Engine engine(solo_model, tok, {kEos}, solo_opts);
    solo = run_all(engine, reqs, false);
  }
  int eos = 0, stop_string = 0, length = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    CHECK(solo[i].error.empty());
    CHECK(!solo[i].tokens.empty() || solo[i].finish == "stop");
    // An end-of-sequence token ends the request without being sent; a stop string's last
    // token is sent (its text is cut).
    const bool ended_by_eos = solo[i].timings.predicted_n > static_cast<int>(solo[i].tokens.size());
    if (ended_by_eos) CHECK(solo[i].finish == "stop" && !reqs[i].ignore_eos);
    eos += ended_by_eos;
    stop_string += solo[i].finish == "stop" && !ended_by_eos;
    length += solo[i].finish == "length";
  }
  // The workload exercises every way a request ends, not only lengths.
  CHECK(eos > 0 && stop_string > 0 && length > 0);

  const std::vector<Regime> configs = {
      {4, 16, 1 + 4 * 16, 4, false},  // roomy
      {3, 3, 1 + 4 * 16, 4, false},   // budget = running set: prompts in small chunks
      {3, 5, 1 + 16, 4, true},        // tight pool: preemptions
      {4, 7, 1 + 60, 1, true},        // one-token blocks
  };
  for (const Regime& c : configs) {
    FakeModel model(4, 16, c.kv_blocks, c.block_size, 64);
    Metrics metrics;
    const EngineOptions o = regime_options(c, &metrics);
    std::vector<Outcome> batched;
    {
      Engine engine(model, tok, {kEos}, o);
      batched = run_all(engine, reqs, true);
    }
    for (size_t i = 0; i < reqs.size(); ++i) {
      if (!(batched[i] == solo[i]))
        fail("request " + std::to_string(i) + " differs: solo '" + solo[i].text + "' (" +
             solo[i].finish + ") batched '" + batched[i].text + "' (" + batched[i].finish + ") " +
             batched[i].error);
      CHECK(batched[i].timings.predicted_n == solo[i].timings.predicted_n);
      CHECK(batched[i].timings.prompt_n == solo[i].timings.prompt_n);
    }
    CHECK(model.max_rows_.load() <= c.prefill_chunk);
    const std::string text = metrics.render();
    CHECK(metric(text, "ninfer:kv_blocks_used") == 0);
    CHECK(metric(text, "ninfer:num_requests_running") == 0);
    const double preemptions = metric(text, "ninfer:num_preemptions_total");
    if (c.expect_preemption) CHECK(preemptions > 0);
  }
  std::puts("invariance ok");
}

void test_cancel() {
  const Tokenizer tok = letters_tokenizer();
  // A running request stops within one step of the cancel: the step the engine was in
  // finishes, and the next loop iteration reaps the request before planning another.
  {
    FakeModel model(2, 8, 1 + 2 * 16, 4, 64);
    Gate gate;
    model.set_gate(&gate);
    Metrics metrics;
    EngineOptions o;
    o.metrics = &metrics;
    {
      Engine engine(model, tok, {kEos}, o);
      auto st = engine.submit(long_request("long", 60));
      gate.allow(1);  // the prompt, and the first token
      GenerationEvent ev;
      CHECK(st->next_for(60000, ev) && ev.kind == GenerationEvent::Kind::kText);
      gate.wait_held();  // the engine is inside step 2
      CHECK(model.steps_.load() == 1);
      st->cancel();
      gate.open();
      Outcome rest = collect(*st);
      CHECK(rest.finish == "cancelled");
      CHECK(rest.tokens.size() == 1);   // step 2's token, sent before the request ended
      CHECK(model.steps_.load() == 2);  // no step after the one in flight
      CHECK(rest.timings.predicted_n == 2);
    }  // the loop published its last state before it went idle
    const std::string text = metrics.render();
    CHECK(metric(text, "ninfer:kv_blocks_used") == 0);
    CHECK(metric(text, "ninfer:num_requests_running") == 0);
    CHECK(metric(text, "ninfer:requests_cancelled_total") == 1);
  }
  // A request cancelled while it waits never runs.
  {
    FakeModel model(2, 8, 1 + 2 * 16, 4, 64);
    Gate gate;
    model.set_gate(&gate);
    EngineOptions o;
    o.max_concurrency = 1;
    Engine engine(model, tok, {kEos}, o);
    auto sa = engine.submit(long_request("a", 60));
    CHECK(sa->wait_started(60000));
    gate.wait_held();  // a's first step
    auto sb = engine.submit(long_request("b", 60));
    sb->cancel();
    gate.allow(1);  // after a's first step, the loop reaps b
    Outcome ob = collect(*sb);
    CHECK(ob.finish == "cancelled" && ob.tokens.empty() && !sb->started());
    CHECK(ob.timings.predicted_n == 0 && ob.timings.prompt_ms == 0);
    gate.wait_held();  // a's second step
    sa->cancel();
    gate.open();
    const Outcome oa = collect(*sa);
    CHECK(oa.finish == "cancelled" && oa.timings.predicted_n == 2);
  }
  std::puts("cancel ok");
}

void test_admission() {
  const Tokenizer tok = letters_tokenizer();
  // Queue full: one request runs (held at its first step), one waits, the next is refused.
  {
    FakeModel model(2, 8, 1 + 2 * 16, 4, 64);
    Gate gate;
    model.set_gate(&gate);
    Metrics metrics;
    EngineOptions o;
    o.max_concurrency = 1;
    o.max_pending_requests = 1;
    o.metrics = &metrics;
    Engine engine(model, tok, {kEos}, o);
    auto a = engine.submit(long_request("a", 40));
    CHECK(a->wait_started(60000));
    auto b = engine.submit(long_request("b", 40));  // waits
    bool full = false;
    try {
      engine.submit(long_request("c", 40));
    } catch (const RequestRejected& e) {
      full = e.reason == RequestRejected::Reason::kQueueFull;
    }
    CHECK(full);
    a->cancel();
    b->cancel();
    gate.open();
    CHECK(collect(*a).finish == "cancelled");
    CHECK(collect(*b).finish == "cancelled");
    CHECK(metric(metrics.render(), "ninfer:requests_rejected_total{reason=\"queue_full\"}") == 1);
  }
  // Pending timeout, on the engine's clock: each step costs 5 ms, so a request waiting
  // behind a 50-step one expires at the first check after 40 ms, having waited 45.
  {
    FakeModel model(2, 8, 1 + 2 * 16, 4, 64);
    FakeClock clock;
    model.set_cost(&clock, 5, 0);
    Gate gate;
    model.set_gate(&gate);
    EngineOptions o;
    o.max_concurrency = 1;
    o.pending_timeout_ms = 40;
    o.clock = &clock;
    Engine engine(model, tok, {kEos}, o);
    auto a = engine.submit(long_request("a", 50));
    auto b = engine.submit(long_request("b", 50));
    gate.open();  // both were submitted at 0 ms
    Outcome ob = collect(*b);
    CHECK(ob.error_code == "pending_timeout" && !b->started());
    CHECK(ob.error.find("waited 45 ms") != std::string::npos);
    CHECK(ob.error.find("pending timeout is 40 ms") != std::string::npos);
    Outcome oa = collect(*a);
    CHECK(oa.finish == "length" && oa.timings.predicted_n == 50);  // the running one is fine
    // Its timings, on the same clock: admitted at once, first token after one step.
    CHECK(oa.timings.queue_ms == 0 && oa.timings.prompt_ms == 5);
    CHECK(oa.timings.predicted_ms == 49 * 5);
  }
  // Requests that can never fit are refused at once; prompt problems are named before
  // max_tokens problems.
  {
    FakeModel model(2, 8, 1 + 6, 4, 64);  // pool: 6 blocks = 24 positions; context 64
    EngineOptions o;
    o.max_context = 48;
    Engine engine(model, tok, {kEos}, o);
    CHECK(engine.max_context() == 48 && engine.max_positions() == 24);
    auto reason = [&](int prompt, int max_tokens) -> std::string {
      GenerationRequest r;
      r.prompt.assign(prompt, 1);
      r.max_tokens = max_tokens;
      try {
        auto st = engine.submit(r);
        collect(*st);
        return "ok";
      } catch (const RequestRejected& e) {
        return std::string(RequestRejected::name(e.reason)) + ":" + e.param;
      }
    };
    CHECK(reason(48, 1) == "context_length:prompt");
    CHECK(reason(30, 10) == "kv_capacity:prompt");  // fits the context, not the pool
    CHECK(reason(30, 20) == "kv_capacity:prompt");  // both too long: the prompt is named
    CHECK(reason(25, 1) == "kv_capacity:prompt");
    CHECK(reason(20, 30) == "context_length:max_tokens");
    CHECK(reason(20, 6) == "kv_capacity:max_tokens");
    CHECK(reason(20, 5) == "ok");  // 24 positions
    // max_tokens omitted: as many as the pool allows.
    GenerationRequest r;
    r.prompt.assign(10, 1);
    r.ignore_eos = true;
    Outcome o2 = collect(*engine.submit(r));
    CHECK(o2.finish == "length" && o2.timings.predicted_n == 15);
    bool empty = false;
    try {
      engine.submit(GenerationRequest{});
    } catch (const std::invalid_argument&) {
      empty = true;
    }
    CHECK(empty);
  }
  std::puts("admission ok");
}

// --max-decode-slowdown: while A decodes, B's long prompt is cut so that a step costs at
// most X decode-only steps. The fake model's step costs 4 ms plus 0.5 ms per row beyond
// the first of each sequence, on the clock the engine measures with. A runs seven steps
// alone (the engine measures a decode-only step), then B arrives. Returns every step
// that ran both.
std::vector<FakeModel::StepRows> mixed_steps(double slowdown) {
  const Tokenizer tok = letters_tokenizer();
  FakeModel model(2, 32, 1 + 2 * 32, 4, 128);
  FakeClock clock;
  model.set_cost(&clock, 4, 0.5);
  Gate gate;
  model.set_gate(&gate);
  EngineOptions o;
  o.max_decode_slowdown = slowdown;
  o.clock = &clock;
  Engine engine(model, tok, {kEos}, o);
  GenerationRequest a;
  a.prompt = {1, 2};
  a.max_tokens = 120;
  a.ignore_eos = true;
  auto sa = engine.submit(a);
  gate.allow(7);
  gate.wait_held();
  GenerationRequest b;
  b.prompt.assign(100, 3);
  b.max_tokens = 1;
  auto sb = engine.submit(b);
  gate.open();
  Outcome ob = collect(*sb);
  CHECK(ob.finish == "length" && ob.tokens.size() == 1);
  sa->cancel();
  collect(*sa);
  std::vector<FakeModel::StepRows> mixed;
  for (const FakeModel::StepRows& s : model.history())
    if (s.seqs == 2) mixed.push_back(s);
  return mixed;
}

void test_slowdown() {
  const double decode_ms = 4;  // a decode-only step
  // Capped: the first mixed step, before the engine has measured a prompt row, takes the
  // whole budget (A's row and 31 of B's); from then on every step costs at most 1.5
  // decode-only steps. The engine's estimate of a prompt row (0.5 ms a row beyond the
  // first, spread over all of B's rows) stays below the true cost, so B gets 5 rows a
  // step: 4 past its first, 2 ms, exactly the allowance.
  const std::vector<FakeModel::StepRows> capped = mixed_steps(1.5);
  CHECK(!capped.empty() && capped[0].rows == 32);
  int prompt_rows = capped[0].rows - 1;
  for (size_t i = 1; i < capped.size(); ++i) {
    CHECK(capped[i].cost_ms <= 1.5 * decode_ms);
    CHECK(capped[i].rows >= 2);  // B progresses every step
    prompt_rows += capped[i].rows - 1;
  }
  CHECK(prompt_rows == 100);
  int at_allowance = 0;
  for (size_t i = 1; i < capped.size(); ++i) at_allowance += capped[i].cost_ms == 1.5 * decode_ms;
  CHECK(at_allowance > 0);  // the cap binds, it is not merely respected
  // Uncapped (X = 0): every step that carries B fills the step budget.
  const std::vector<FakeModel::StepRows> free = mixed_steps(0);
  std::vector<int> rows;
  for (const auto& s : free) rows.push_back(s.rows);
  CHECK((rows == std::vector<int>{32, 32, 32, 8}));  // 31 + 31 + 31 + 7 prompt rows
  std::printf("slowdown ok (capped steps: %zu, uncapped: %zu)\n", capped.size(), free.size());
}

// Prints a metrics page after real traffic, for the Python side to parse.
void print_metrics() {
  const Tokenizer tok = letters_tokenizer();
  FakeModel model(4, 8, 1 + 20, 4, 64);
  Metrics metrics;
  EngineOptions o;
  o.metrics = &metrics;
  {
    Engine engine(model, tok, {kEos}, o);
    run_all(engine, workload(), true);
    try {
      GenerationRequest r;
      r.prompt.assign(100, 1);
      engine.submit(r);
    } catch (const RequestRejected&) {
    }
  }
  std::fputs(metrics.render().c_str(), stdout);
}

// Writes a request log with every kind of event.
void write_log(const std::string& path) {
  const Tokenizer tok = letters_tokenizer();
  RequestLog log(path);
  FakeModel model(2, 8, 1 + 2 * 16, 4, 64);
  Gate gate;
  model.set_gate(&gate);
  EngineOptions o;
  o.max_concurrency = 1;
  o.max_pending_requests = 1;
  o.request_log = &log;
  Engine engine(model, tok, {kEos}, o);
  gate.open();
  GenerationRequest r = long_request("done-1", 5);
  collect(*engine.submit(r));
  r.id = "too-long";
  r.max_tokens = 100;
  try {
    engine.submit(r);
  } catch (const RequestRejected&) {
  }
  gate.close();  // cancel-1 is held at its first step, so wait-1 waits and full-1 is refused
  r.id = "cancel-1";
  r.max_tokens = 40;
  auto a = engine.submit(r);
  CHECK(a->wait_started(60000));
  r.id = "wait-1";
  auto b = engine.submit(r);
  r.id = "full-1";
  try {
    engine.submit(r);
  } catch (const RequestRejected&) {
  }
  a->cancel();
  b->cancel();
  gate.open();
  CHECK(collect(*a).finish == "cancelled");
  CHECK(collect(*b).finish == "cancelled");

  FakeModel broken(2, 8, 1 + 2 * 16, 4, 64);
  broken.fail_at_step_ = 1;
  Engine engine2(broken, tok, {kEos}, o);
  r.id = "error-1";
  Outcome e = collect(*engine2.submit(r));
  CHECK(e.error.find("device lost") != std::string::npos);
}

}  // namespace ninfer::fake
