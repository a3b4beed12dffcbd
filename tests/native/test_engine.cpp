// Standalone tests of the continuous-batching runtime (KvBlocks, Scheduler, Engine,
// Metrics, RequestLog) against the fake paged model of fake_model.h; built and run by
// tests/test_scheduler_native.py.
//
// usage: test_engine scheduler | invariance | cancel | admission | sampling | slowdown |
//        metrics | log FILE
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "fake_model.h"
#include "engine/kv_blocks.h"
#include "observe/metrics.h"
#include "model/model.h"
#include "observe/request_log.h"
#include "engine/sampling.h"
#include "engine/scheduler.h"
#include "text/tokenizer.h"

using namespace ninfer;
using namespace ninfer::fake;

namespace {

Tokenizer letters_tokenizer() { return Tokenizer::from_json(letters_tokenizer_json()); }

// ---------------------------------------------------------------------------------------
// KvBlocks and Scheduler

void test_kv_blocks() {
  KvBlocks kv(5, 4);  // blocks 1..4
  CHECK(kv.total() == 4 && kv.free() == 4 && kv.used() == 0);
  CHECK(kv.blocks_for(0) == 0 && kv.blocks_for(1) == 1 && kv.blocks_for(4) == 1 &&
        kv.blocks_for(5) == 2);
  std::vector<int32_t> a, b;
  CHECK(kv.grow(a, 5));
  CHECK(a.size() == 2 && a[0] == 1 && a[1] == 2 && kv.free() == 2);
  CHECK(kv.grow(a, 8) && a.size() == 2);  // still covered
  CHECK(!kv.grow(b, 13));                   // needs 4, 2 free: all or nothing
  CHECK(b.empty() && kv.free() == 2);
  CHECK(kv.grow(b, 8) && kv.free() == 0 && b[0] == 3 && b[1] == 4);
  kv.release(a);
  CHECK(a.empty() && kv.free() == 2 && kv.used() == 2);
  std::vector<int32_t> bogus = {3};
  kv.release(b);
  bool threw = false;
  try {
    kv.release(bogus);  // double free
  } catch (const std::logic_error&) {
    threw = true;
  }
  CHECK(threw);
  bool bad_pool = false;
  try {
    KvBlocks tiny(1, 4);
  } catch (const std::invalid_argument&) {
    bad_pool = true;
  }
  CHECK(bad_pool);

  std::vector<int32_t> tables(3 * 4, -1);
  std::vector<int32_t> s0 = {5, 6}, s2 = {7};
  fill_block_tables(tables.data(), 3, 4, {&s0, nullptr, &s2});
  const std::vector<int32_t> want = {5, 6, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0};
  CHECK(tables == want);
}

// Drives a Scheduler like the engine does, with "sampling" that appends a token after
// every logits row until the sequence has `total` tokens, and checks invariants each step.
struct SimSeq : Sequence {
  int total = 0;          // prompt + generated at the end
  int prompt = 0;
  int fed_to = 0;         // positions fed so far in this residency (checks order)
  bool done = false;
};

void check_plan(const Scheduler& sc, const StepPlan& plan) {
  const SchedulerConfig& cfg = sc.config();
  CHECK(plan.rows <= cfg.step_tokens);
  int rows = 0;
  std::set<const Sequence*> seen;
  bool prefill_seen = false;
  for (const Chunk& c : plan.chunks) {
    CHECK(seen.insert(c.seq).second);  // one chunk per sequence
    CHECK(c.count >= 1 && c.start == c.seq->num_computed);
    CHECK(c.start + c.count <= static_cast<int>(c.seq->tokens.size()));
    CHECK(c.logits == (c.start + c.count == static_cast<int>(c.seq->tokens.size())));
    CHECK(c.seq->slot >= 0 && c.seq->slot < cfg.max_concurrency);
    CHECK(static_cast<int>(c.seq->blocks.size()) * cfg.block_size >= c.start + c.count);
    const bool admitted = std::find(plan.admitted.begin(), plan.admitted.end(), c.seq) !=
                          plan.admitted.end();
    const bool decode = c.seq->pending() == 1 && !admitted;
    if (decode)
      CHECK(!prefill_seen);  // decode rows first
    else
      prefill_seen = true;
    rows += c.count;
  }
  CHECK(rows == plan.rows);
  // With a row per running request in the budget, no decode waits behind a prompt.
  if (cfg.step_tokens >= cfg.max_concurrency && plan.preempted.empty())
    for (const Sequence* s : sc.running())
      if (s->pending() == 1) CHECK(seen.count(s) == 1);
  // Running sequences own disjoint blocks, never block 0; the pool count is exact.
  std::set<int32_t> owned;
  int used = 0;
  std::set<int> slots;
  for (const Sequence* s : sc.running()) {
    CHECK(slots.insert(s->slot).second);
    for (int32_t b : s->blocks) {
      CHECK(b >= 1 && b < cfg.kv_blocks);
      CHECK(owned.insert(b).second);
    }
    used += static_cast<int>(s->blocks.size());
  }
  for (const Sequence* s : sc.waiting()) CHECK(s->blocks.empty() && s->slot == -1);
  CHECK(used == sc.kv().used());
  CHECK(static_cast<int>(sc.running().size()) <= cfg.max_concurrency);
}

// Runs sequences to completion; returns the number of steps.
int simulate(const SchedulerConfig& cfg, std::vector<SimSeq>& seqs, int max_steps = 100000) {
  Scheduler sc(cfg);
  for (SimSeq& s : seqs) sc.add(&s);
  int steps = 0, live = static_cast<int>(seqs.size());
  std::vector<int32_t> tables(static_cast<size_t>(cfg.table_rows) * cfg.blocks_per_seq);
  while (live > 0) {
    CHECK(++steps < max_steps);
    StepPlan plan = sc.plan();
    CHECK(plan.rows > 0);  // something always runs
    check_plan(sc, plan);
    sc.fill_block_tables(tables.data());
    for (Sequence* p : plan.preempted) static_cast<SimSeq&>(*p).fed_to = 0;  // KV gone
    for (const Chunk& c : plan.chunks) {
      SimSeq& s = static_cast<SimSeq&>(*c.seq);
      CHECK(c.start == s.fed_to);
      s.fed_to += c.count;
      const int32_t* row = tables.data() + static_cast<size_t>(s.slot) * cfg.blocks_per_seq;
      for (size_t i = 0; i < s.blocks.size(); ++i) CHECK(row[i] == s.blocks[i]);
    }
    sc.commit(plan);
    for (const Chunk& c : plan.chunks) {
      if (!c.logits) continue;
      SimSeq& s = static_cast<SimSeq&>(*c.seq);
      // The sampled token is the sequence's last (total - 1 tokens stored) or fed back.
      if (static_cast<int>(s.tokens.size()) + 1 >= s.total)
        s.done = true;
      else
        s.tokens.push_back(static_cast<int32_t>(s.tokens.size() % kVocab));
      if (s.done) {
        sc.remove(&s);
        --live;
      }
    }
  }
  CHECK(sc.kv().used() == 0 && sc.running().empty() && sc.waiting().empty());
  return steps;
}

std::vector<SimSeq> make_seqs(const std::vector<std::pair<int, int>>& prompt_total) {
  std::vector<SimSeq> seqs(prompt_total.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    seqs[i].prompt = prompt_total[i].first;
    seqs[i].total = prompt_total[i].second;
    for (int t = 0; t < seqs[i].prompt; ++t) seqs[i].tokens.push_back(t % kVocab);
  }
  return seqs;
}

void test_scheduler() {
  test_kv_blocks();

  // A long prompt is chunked and never stalls the decode of a running request.
  {
    SchedulerConfig cfg{/*max_concurrency=*/2, /*table_rows=*/2, /*step_tokens=*/4,
                        /*kv_blocks=*/65, /*block_size=*/4, /*blocks_per_seq=*/16};
    Scheduler sc(cfg);
    auto seqs = make_seqs({{2, 40}, {20, 24}});
    sc.add(&seqs[0]);
    StepPlan p = sc.plan();  // admits A: its 2-token prompt
    CHECK(p.admitted.size() == 1 && p.rows == 2 && p.chunks[0].logits);
    sc.commit(p);
    seqs[0].tokens.push_back(1);  // sampled
    sc.add(&seqs[1]);
    int b_chunks = 0;
    for (int step = 0; step < 6; ++step) {
      p = sc.plan();
      check_plan(sc, p);
      CHECK(!p.chunks.empty() && p.chunks[0].seq == &seqs[0] && p.chunks[0].count == 1);
      for (const Chunk& c : p.chunks)
        if (c.seq == &seqs[1]) {
          ++b_chunks;
          CHECK(c.count <= 3);
        }
      sc.commit(p);
      seqs[0].tokens.push_back(2);
      if (seqs[1].pending() == 0) break;
    }
    CHECK(b_chunks == 6 && seqs[1].num_computed == 18);
  }

  // A prefill limit caps prompt rows only while something decodes (at least one row,
  // so the prompt still progresses); alone, a prompt takes the whole budget.
  {
    SchedulerConfig cfg{2, 2, /*step_tokens=*/8, /*kv_blocks=*/65, /*block_size=*/4,
                        /*blocks_per_seq=*/16};
    Scheduler sc(cfg);
    auto seqs = make_seqs({{20, 40}, {30, 40}});
    sc.add(&seqs[0]);
    StepPlan p = sc.plan(/*prefill_limit=*/2);
    CHECK(p.rows == 8);  // nothing decodes yet: the limit does not apply
    sc.commit(p);
    for (int step = 0; step < 3; ++step) {  // finish A's prompt alone
      p = sc.plan(2);
      sc.commit(p);
    }
    CHECK(seqs[0].pending() == 0);
    seqs[0].tokens.push_back(1);
    sc.add(&seqs[1]);
    for (int limit : {3, 0, 1}) {
      p = sc.plan(limit);
      check_plan(sc, p);
      CHECK(p.chunks[0].seq == &seqs[0] && p.chunks[0].count == 1);
      CHECK(p.rows == 1 + std::max(1, limit));
      sc.commit(p);
      seqs[0].tokens.push_back(2);
    }
  }

  // Preemption: a pool far too small for everyone at once; all finish, none starve,
  // and the youngest is the one sent back.
  {
    SchedulerConfig cfg{4, 4, 8, /*kv_blocks=*/9, /*block_size=*/4, /*blocks_per_seq=*/8};
    auto seqs = make_seqs({{5, 30}, {9, 28}, {3, 31}, {12, 20}, {1, 25}, {7, 29}});
    simulate(cfg, seqs);
    int preempted = 0;
    for (auto& s : seqs) preempted += s.preemptions;
    CHECK(preempted > 0);
    CHECK(seqs[0].preemptions == 0);  // the oldest is never preempted
  }

  // Random workloads over many configurations.
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 300; ++trial) {
    SchedulerConfig cfg;
    cfg.table_rows = 1 + rng() % 6;
    cfg.max_concurrency = 1 + rng() % cfg.table_rows;
    cfg.step_tokens = 1 + rng() % 12;
    cfg.block_size = 1 + rng() % 5;
    cfg.blocks_per_seq = 4 + rng() % 8;
    const int max_pos = cfg.blocks_per_seq * cfg.block_size;
    cfg.kv_blocks = 1 + cfg.blocks_per_seq + rng() % (cfg.blocks_per_seq * 3);
    std::vector<std::pair<int, int>> pt;
    const int n = 1 + rng() % 10;
    for (int i = 0; i < n; ++i) {
      const int total = 2 + rng() % (max_pos - 1);  // stored positions <= total - 1
      const int prompt = 1 + rng() % (total - 1);
      pt.push_back({prompt, total});
    }
    auto seqs = make_seqs(pt);
    simulate(cfg, seqs);
    for (auto& s : seqs) CHECK(static_cast<int>(s.tokens.size()) == s.total - 1 && s.done);
  }
  std::puts("scheduler ok");
}

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

Outcome collect(RequestState& st) {
  Outcome o;
  for (;;) {
    GenerationEvent ev = st.next();
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
    if (i % 5 == 2) r.stop = {"q"};
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

double metric(const std::string& text, const std::string& name) {
  const std::string key = name + " ";
  size_t p = 0;
  while ((p = text.find(key, p)) != std::string::npos) {
    if (p == 0 || text[p - 1] == '\n') return std::atof(text.c_str() + p + key.size());
    p += key.size();
  }
  std::fprintf(stderr, "metric %s not found\n", name.c_str());
  std::exit(1);
}

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
  int stopped = 0, eos = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    CHECK(solo[i].error.empty());
    CHECK(!solo[i].tokens.empty() || solo[i].finish == "stop");
    if (solo[i].finish == "stop") ++stopped;
    if (solo[i].timings.predicted_n > static_cast<int>(solo[i].tokens.size())) ++eos;
  }
  CHECK(stopped > 0);  // the workload exercises stops, not only lengths

  struct Config {
    int concurrency, step_tokens, kv_blocks, block_size;
    bool expect_preemption;
  };
  const std::vector<Config> configs = {
      {4, 16, 1 + 4 * 16, 4, false},  // roomy
      {3, 3, 1 + 4 * 16, 4, false},   // budget = running set: prompts in small chunks
      {3, 5, 1 + 16, 4, true},        // tight pool: preemptions
      {4, 7, 1 + 60, 1, true},        // one-token blocks
  };
  for (const Config& c : configs) {
    FakeModel model(4, 16, c.kv_blocks, c.block_size, 64);
    Metrics metrics;
    EngineOptions o;
    o.max_concurrency = c.concurrency;
    o.step_tokens = c.step_tokens;
    o.max_pending = 0;
    o.metrics = &metrics;
    std::vector<Outcome> batched;
    {
      Engine engine(model, tok, {kEos}, o);
      batched = run_all(engine, reqs, true);
    }
    for (size_t i = 0; i < reqs.size(); ++i) {
      if (!(batched[i] == solo[i])) {
        std::fprintf(stderr, "request %zu differs: solo '%s' (%s) batched '%s' (%s) %s\n", i,
                     solo[i].text.c_str(), solo[i].finish.c_str(), batched[i].text.c_str(),
                     batched[i].finish.c_str(), batched[i].error.c_str());
        std::exit(1);
      }
      CHECK(batched[i].timings.predicted_n == solo[i].timings.predicted_n);
      CHECK(batched[i].timings.prompt_n == solo[i].timings.prompt_n);
    }
    CHECK(model.max_rows_.load() <= c.step_tokens);
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
  FakeModel model(2, 8, 1 + 2 * 16, 4, 64, /*step_sleep_ms=*/5);
  Metrics metrics;
  EngineOptions o;
  o.metrics = &metrics;
  Engine engine(model, tok, {kEos}, o);
  GenerationRequest r;
  r.id = "long";
  r.prompt = {1, 2, 3};
  r.max_tokens = 60;
  r.ignore_eos = true;
  auto st = engine.submit(r);
  GenerationEvent ev = st->next();
  CHECK(ev.kind == GenerationEvent::Kind::kText);
  const int steps_at_cancel = model.steps_.load();
  st->cancel();
  Outcome rest = collect(*st);
  CHECK(rest.finish == "cancelled");
  CHECK(model.steps_.load() <= steps_at_cancel + 2);  // stopped within a step
  // Blocks and slot are free again (published after the step).
  for (int i = 0; i < 100 && metric(metrics.render(), "ninfer:kv_blocks_used") != 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const std::string text = metrics.render();
  CHECK(metric(text, "ninfer:kv_blocks_used") == 0);
  CHECK(metric(text, "ninfer:num_requests_running") == 0);
  CHECK(metric(text, "ninfer:requests_cancelled_total") == 1);

  // A request cancelled while it waits never runs.
  GenerationRequest a = r, b = r;
  a.id = "a";
  b.id = "b";
  EngineOptions o1;
  o1.max_concurrency = 1;
  FakeModel model1(2, 8, 1 + 2 * 16, 4, 64, 5);
  Engine one(model1, tok, {kEos}, o1);
  auto sa = one.submit(a);
  CHECK(sa->wait_started(2000));
  auto sb = one.submit(b);
  sb->cancel();
  Outcome ob = collect(*sb);
  CHECK(ob.finish == "cancelled" && ob.tokens.empty() && !sb->started());
  sa->cancel();
  CHECK(collect(*sa).finish == "cancelled");
  std::puts("cancel ok");
}

void test_admission() {
  const Tokenizer tok = letters_tokenizer();
  // Queue full.
  {
    FakeModel model(2, 8, 1 + 2 * 16, 4, 64, 5);
    Metrics metrics;
    EngineOptions o;
    o.max_concurrency = 1;
    o.max_pending = 1;
    o.metrics = &metrics;
    Engine engine(model, tok, {kEos}, o);
    GenerationRequest r;
    r.prompt = {1, 2};
    r.max_tokens = 40;
    r.ignore_eos = true;
    auto a = engine.submit(r);
    CHECK(a->wait_started(2000));
    auto b = engine.submit(r);  // waits
    bool full = false;
    try {
      engine.submit(r);
    } catch (const RequestRejected& e) {
      full = e.reason == RequestRejected::Reason::kQueueFull;
    }
    CHECK(full);
    a->cancel();
    b->cancel();
    collect(*a);
    collect(*b);
    CHECK(metric(metrics.render(), "ninfer:requests_rejected_total{reason=\"queue_full\"}") == 1);
  }
  // Pending timeout.
  {
    FakeModel model(2, 8, 1 + 2 * 16, 4, 64, 5);
    EngineOptions o;
    o.max_concurrency = 1;
    o.pending_timeout_ms = 40;
    Engine engine(model, tok, {kEos}, o);
    GenerationRequest r;
    r.prompt = {1, 2};
    r.max_tokens = 50;
    r.ignore_eos = true;
    auto a = engine.submit(r);
    auto b = engine.submit(r);
    Outcome ob = collect(*b);
    CHECK(ob.error_code == "pending_timeout" && !b->started());
    Outcome oa = collect(*a);
    CHECK(oa.finish == "length" && oa.timings.predicted_n == 50);  // the running one is fine
  }
  // Requests that can never fit.
  {
    FakeModel model(2, 8, 1 + 6, 4, 64);  // pool: 6 blocks = 24 positions; context 64
    EngineOptions o;
    o.context_limit = 48;
    Engine engine(model, tok, {kEos}, o);
    CHECK(engine.context_limit() == 48 && engine.max_positions() == 24);
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
    CHECK(reason(30, 10) == "context_length:max_tokens" || reason(30, 10) == "kv_capacity:prompt");
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
// the first of each sequence, so with X = 1.5 a step that decodes A and prefills B may
// carry (1.5 - 1) * 4 / 0.5 = 4 such rows once the engine has measured both costs (the
// first mixed step, before that, may take the whole budget). X = 0 lets every step fill
// the step budget. Returns those extra rows of every step that ran both A and B.
std::vector<int> mixed_prompt_rows(double slowdown) {
  const Tokenizer tok = letters_tokenizer();
  FakeModel model(2, 32, 1 + 2 * 32, 4, 128);
  model.set_step_cost(4000, 500);
  EngineOptions o;
  o.max_decode_slowdown = slowdown;
  Engine engine(model, tok, {kEos}, o);
  GenerationRequest a;
  a.prompt = {1, 2};
  a.max_tokens = 120;
  a.ignore_eos = true;
  auto sa = engine.submit(a);
  for (int got = 0; got < 6;) {  // decode-only steps first: the engine measures them
    GenerationEvent ev = sa->next();
    CHECK(ev.kind == GenerationEvent::Kind::kText);
    got += static_cast<int>(ev.tokens.size());
  }
  GenerationRequest b;
  b.prompt.assign(100, 3);
  b.max_tokens = 1;
  Outcome ob = collect(*engine.submit(b));
  CHECK(ob.finish == "length" && ob.tokens.size() == 1);
  sa->cancel();
  collect(*sa);
  std::vector<int> rows;
  for (const FakeModel::StepRows& s : model.history())
    if (s.seqs == 2) rows.push_back(s.rows - 2);  // A's row and B's first are not extra
  return rows;
}

void test_slowdown() {
  const std::vector<int> capped = mixed_prompt_rows(1.5);
  CHECK(capped.size() >= 10);  // 100 prompt tokens at <= 5 rows per step after the first
  int over = 0;
  for (size_t i = 1; i < capped.size(); ++i) over += capped[i] > 5;  // 4 (+1: timer noise)
  CHECK(over <= 1);
  CHECK(*std::max_element(capped.begin() + 1, capped.end()) >= 2);  // B still progresses
  const std::vector<int> free = mixed_prompt_rows(0);
  CHECK(!free.empty() && free.size() <= 5);  // 31 prompt rows next to A per step
  CHECK(*std::max_element(free.begin(), free.end()) == 30);
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
  FakeModel model(2, 8, 1 + 2 * 16, 4, 64, 3);
  EngineOptions o;
  o.max_concurrency = 1;
  o.max_pending = 1;
  o.request_log = &log;
  Engine engine(model, tok, {kEos}, o);
  GenerationRequest r;
  r.prompt = {1, 2, 3};
  r.max_tokens = 5;
  r.ignore_eos = true;
  r.id = "done-1";
  collect(*engine.submit(r));
  r.id = "too-long";
  r.max_tokens = 100;
  try {
    engine.submit(r);
  } catch (const RequestRejected&) {
  }
  r.id = "cancel-1";
  r.max_tokens = 40;
  auto a = engine.submit(r);
  CHECK(a->wait_started(2000));
  r.id = "wait-1";
  auto b = engine.submit(r);
  r.id = "full-1";
  try {
    engine.submit(r);
  } catch (const RequestRejected&) {
  }
  a->next();
  a->cancel();
  collect(*a);
  b->cancel();
  collect(*b);

  FakeModel broken(2, 8, 1 + 2 * 16, 4, 64);
  broken.fail_at_step_ = 1;
  Engine engine2(broken, tok, {kEos}, o);
  r.id = "error-1";
  Outcome e = collect(*engine2.submit(r));
  CHECK(e.error.find("device lost") != std::string::npos);
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Sampler: empirical frequencies against the exact top-k / top-p / temperature
// distribution (computed here by a full sort), on a 3000-token vocabulary whose mass
// spreads over hundreds of tokens, so that the top-p prefix search grows several times.

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "%s\n", what.c_str());
  std::exit(1);
}

void check_sampler(const std::vector<float>& logits, const SamplingParams& p, int draws) {
  const int vocab = static_cast<int>(logits.size());
  std::vector<int> order(vocab);
  for (int i = 0; i < vocab; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return logits[a] > logits[b]; });
  const int k = p.top_k > 0 ? std::min(p.top_k, vocab) : vocab;
  std::vector<double> w(k);
  double total = 0;
  for (int i = 0; i < k; ++i) total += w[i] = std::exp((logits[order[i]] - logits[order[0]]) /
                                                       p.temperature);
  int keep = k;
  double cum = 0;
  for (int i = 0; i < k && p.top_p < 1.0f; ++i) {
    cum += w[i] / total;
    if (cum >= p.top_p) {
      keep = i + 1;
      break;
    }
  }
  double kept = 0;
  for (int i = 0; i < keep; ++i) kept += w[i];
  std::vector<double> want(vocab, 0.0);
  for (int i = 0; i < keep; ++i) want[order[i]] = w[i] / kept;
  std::vector<int> seen(vocab, 0);
  Sampler sampler(1234);
  for (int d = 0; d < draws; ++d) ++seen[sampler.sample(logits.data(), vocab, p)];
  double tv = 0;  // total variation distance
  for (int i = 0; i < vocab; ++i) {
    if (seen[i] > 0 && want[i] == 0)
      fail("sampled token " + std::to_string(i) + " outside the kept set");
    tv += std::abs(seen[i] / double(draws) - want[i]) / 2;
  }
  // with `keep` outcomes and `draws` draws the expected TV is ~sqrt(keep / draws) / 2.5
  const double bound = 0.02 + 0.6 * std::sqrt(keep / double(draws));
  if (tv > bound)
    fail("sampler: total variation " + std::to_string(tv) + " > " + std::to_string(bound) +
         " (keep " + std::to_string(keep) + ")");
}

void test_sampling() {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  std::vector<float> logits(3000);
  for (float& x : logits) x = normal(rng);
  SamplingParams p;
  for (float top_p : {1.0f, 0.95f, 0.5f, 0.05f})
    for (int top_k : {0, 40})
      for (float temperature : {1.0f, 0.7f}) {
        p.top_p = top_p;
        p.top_k = top_k;
        p.temperature = temperature;
        check_sampler(logits, p, 200000);
      }
  std::printf("sampling ok\n");
}

int main(int argc, char** argv) {
  const std::string what = argc > 1 ? argv[1] : "";
  if (what == "scheduler") test_scheduler();
  else if (what == "invariance") test_invariance();
  else if (what == "cancel") test_cancel();
  else if (what == "admission") test_admission();
  else if (what == "sampling") test_sampling();
  else if (what == "slowdown") test_slowdown();
  else if (what == "metrics") print_metrics();
  else if (what == "log" && argc > 2) write_log(argv[2]);
  else {
    std::fprintf(stderr, "usage: test_engine scheduler|invariance|cancel|admission|sampling|slowdown|metrics|log FILE\n");
    return 2;
  }
  return 0;
}
