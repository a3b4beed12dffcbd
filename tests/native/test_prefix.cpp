// Prefix caching (engine/kv_blocks.h, engine/scheduler.h): the block cache alone (publish,
// match, acquire, LRU eviction, a colliding hash is a miss), the scheduler's admission from
// a cached prefix, then the engine against the fake model, whose logits hash every token
// the KV pool holds for the row's sequence (so a cached block with other tokens, a shared
// block written, or a recurrent state checkpoint restored at the wrong prefix changes the
// output or fails a check): a request served from the cache gives exactly the tokens it
// gives on a cold engine (prefix caching off), in multi-turn conversations, four streams
// sharing a prefix at once, under eviction, preemption, cancellation during the prefill of
// a shared prefix, n > 1, n-gram and MTP speculation, and for a model with recurrent state
// (hits only at checkpoints); a soak of shared-prefix requests leaves no block or
// checkpoint behind.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "drafters.h"
#include "engine/engine.h"
#include "engine/kv_blocks.h"
#include "engine/scheduler.h"
#include "harness.h"
#include "observe/metrics.h"

namespace ninfer::fake {
namespace {

using Tokens = std::vector<int32_t>;

void test_block_cache() {
  KvBlocks kv(7, 4);  // blocks 1..6
  kv.set_caching(true);
  PrefixHasher hasher(4, 0);
  Tokens toks(12);
  for (int i = 0; i < 12; ++i) toks[i] = i;
  std::vector<uint64_t> hs;
  hasher.extend(hs, toks.data(), 11);  // two full blocks only
  CHECK(hs.size() == 2);
  hasher.extend(hs, toks.data(), 12);
  CHECK(hs.size() == 3);
  Tokens changed = toks;  // the first token changes every hash of the chain
  changed[0] = 20;
  std::vector<uint64_t> hc;
  hasher.extend(hc, changed.data(), 12);
  for (int i = 0; i < 3; ++i) CHECK(hc[i] != hs[i]);

  std::vector<int32_t> a;
  CHECK(kv.grow(a, 12) && a.size() == 3);
  CHECK(kv.match(hs, toks.data(), 12, 3).empty());  // nothing published yet
  for (int i = 0; i < 3; ++i)
    CHECK(kv.publish(a[i], hs[i], i ? hs[i - 1] : 0, toks.data() + 4 * i, 4));
  CHECK(!kv.publish(a[0], hs[0], 0, toks.data(), 4));  // published already
  std::vector<int32_t> dup;                            // the same content computed twice
  CHECK(kv.grow(dup, 4) && !kv.publish(dup[0], hs[0], 0, toks.data(), 4));
  kv.release(dup);  // a private block: plain free
  CHECK(kv.free() == 3 && kv.cached() == 3);
  CHECK(kv.match(hs, toks.data(), 12, 3) == a);
  CHECK(kv.match(hs, toks.data(), 12, 2).size() == 2);
  CHECK(kv.match(hs, toks.data(), 11, 3).size() == 2);  // the third block's tokens not given
  Tokens other = toks;  // the hashes asked for with other tokens: a collision, a miss
  other[5] = 21;
  CHECK(kv.match(hs, other.data(), 12, 3).size() == 1);
  CHECK(kv.match(hc, changed.data(), 12, 3).empty());

  const std::vector<int32_t> held = a;
  kv.release(a);  // cached and unreferenced: free, still matched
  a = held;
  CHECK(kv.free() == 6 && kv.used() == 0 && kv.cached() == 3);
  std::vector<int32_t> b;
  kv.acquire(kv.match(hs, toks.data(), 12, 2), b);
  CHECK(b.size() == 2 && b[0] == a[0] && kv.refs(b[0]) == 1 && kv.free() == 4);
  CHECK(kv.unreferenced(a) == 1);
  // Plain free blocks go first, then the least recently used cached one: a's tail (a
  // sequence's blocks are released last to first).
  std::vector<int32_t> c;
  CHECK(kv.grow(c, 16) && c.size() == 4);
  CHECK(std::find(c.begin(), c.end(), a[2]) != c.end());
  CHECK(kv.evictions() == 1 && kv.cached() == 2 && kv.free() == 0);
  CHECK(kv.match(hs, toks.data(), 12, 3).size() == 2);
  std::vector<int32_t> d;
  CHECK(!kv.grow(d, 1));  // the held cached blocks are not evicted
  kv.release(c);
  kv.release(b);
  CHECK(kv.free() == 6 && kv.used() == 0);
  // An evicted block's content is gone: publishing it again works.
  std::vector<int32_t> e;
  CHECK(kv.grow(e, 24) && kv.cached() == 0 && kv.evictions() == 3);
  CHECK(kv.publish(e[0], hs[0], 0, toks.data(), 4));
  kv.release(e);

  // MTP: a block's hash covers the next token too.
  PrefixHasher extra(4, 1);
  std::vector<uint64_t> hx;
  extra.extend(hx, toks.data(), 8);
  CHECK(hx.size() == 1);  // block 1 needs token 8
  Tokens next = toks;
  next[4] = 25;
  std::vector<uint64_t> hn;
  extra.extend(hn, next.data(), 8);
  CHECK(hn[0] != hx[0]);  // block 0 differs by the token after it
}

struct Seq : Sequence {
  int total = 0;
};

// The scheduler takes the longest cached chain that leaves the last token to compute,
// counts queries and hits, and its blocks' references.
void test_scheduler_hits() {
  SchedulerConfig cfg{2, 2, 8, /*kv_blocks=*/17, /*block_size=*/4, /*blocks_per_seq=*/8};
  cfg.prefix_caching = true;
  Scheduler sc(cfg);
  auto run_prompt = [&](Seq& s) {
    for (int guard = 0; s.pending() > 0 && guard < 20; ++guard) sc.commit(sc.plan());
    CHECK(s.pending() == 0);
  };
  Seq a;
  for (int i = 0; i < 14; ++i) a.tokens.push_back(i);
  sc.add(&a);
  run_prompt(a);
  CHECK(a.cached_tokens == 0 && sc.kv().cached() == 3);  // 14 computed: 3 full blocks
  sc.remove(&a);
  CHECK(sc.kv().used() == 0 && sc.kv().cached() == 3);

  Seq b;  // a's first 10 tokens, then others: the 2 blocks of 0..7
  for (int i = 0; i < 10; ++i) b.tokens.push_back(i);
  for (int i = 0; i < 6; ++i) b.tokens.push_back(20 + i);
  sc.add(&b);
  StepPlan p = sc.plan();
  CHECK(p.admitted.size() == 1 && b.cached_tokens == 8 && b.num_computed == 8);
  CHECK(p.chunks.size() == 1 && p.chunks[0].start == 8 && p.chunks[0].count == 8);
  CHECK(sc.kv().refs(b.blocks[0]) == 1 && sc.prefix_hits() == 8 && sc.prefix_queries() == 30);
  sc.commit(p);

  Seq c;  // a's 12 first tokens exactly: 3 blocks cached, but the last token is computed
  for (int i = 0; i < 12; ++i) c.tokens.push_back(i);
  sc.add(&c);
  p = sc.plan();
  CHECK(c.cached_tokens == 8 && p.chunks.back().start == 8 && p.chunks.back().count == 4);
  CHECK(sc.kv().refs(c.blocks[0]) == 2);  // shared with b
  sc.commit(p);
  sc.remove(&b);
  sc.remove(&c);
  CHECK(sc.kv().used() == 0);
}

// ---- the engine against the fake model

GenerationRequest request(const Tokens& prompt, int max_tokens, int i) {
  GenerationRequest r;
  r.id = "prefix-" + std::to_string(i);
  r.prompt = prompt;
  r.max_tokens = max_tokens;
  r.seed = 700 + static_cast<uint64_t>(i);
  r.sampling.temperature = i % 2 == 0 ? 0.0f : 0.8f;
  r.ignore_eos = i % 3 != 0;
  if (i % 5 == 3) r.sampling.top_k = 5;
  if (i % 7 == 2) r.logprobs = 1;
  return r;
}

Tokens random_tokens(std::mt19937& rng, int n) {
  Tokens t(n);
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % 26);
  return t;
}

// `prefix` followed by `n` random tokens.
Tokens with_tail(const Tokens& prefix, std::mt19937& rng, int n) {
  Tokens p = prefix;
  const Tokens tail = random_tokens(rng, n);
  p.insert(p.end(), tail.begin(), tail.end());
  return p;
}

struct Families {
  int count, len0, len_step;  // random prefixes of len0, len0 + len_step, ... tokens
};
struct NewTokens {
  int min, span;  // max_tokens in min .. min + span - 1
};

// `n` requests, each one of the families' prefixes (drawn at random) and 1..max_tail random
// tokens after it.
std::vector<GenerationRequest> family_requests(std::mt19937& rng, Families f, int n, int max_tail,
                                               NewTokens out) {
  std::vector<Tokens> prefixes;
  for (int i = 0; i < f.count; ++i) prefixes.push_back(random_tokens(rng, f.len0 + i * f.len_step));
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < n; ++i) {
    const Tokens& prefix = prefixes[rng() % prefixes.size()];
    const Tokens p = with_tail(prefix, rng, 1 + static_cast<int>(rng() % max_tail));
    reqs.push_back(request(p, out.min + static_cast<int>(rng() % out.span), i));
  }
  return reqs;
}

struct Config {
  bool recurrent = false;
  int checkpoints = 0;
  bool mtp = false;
  bool ngram = false;
  int align = 1, interval = 0;  // the model's prefill alignment; --state-checkpoint-interval
  int concurrency = 4, chunk = 16, kv_blocks = 1 + 4 * 24, block = 4, context = 96;
  int granularity() const { return std::lcm(block, align); }  // of checkpoint positions
};

std::unique_ptr<FakeModel> make_model(const Config& c) {
  auto m = std::make_unique<FakeModel>(c.concurrency, c.chunk, c.kv_blocks, c.block, c.context);
  if (c.mtp) m->set_mtp(3, random_mtp(5));
  else if (c.ngram) m->set_spec(3);
  if (c.recurrent) m->set_recurrent(c.checkpoints);
  m->set_prefill_align(c.align);
  return m;
}

EngineOptions options(const Config& c, bool caching, Metrics* metrics) {
  EngineOptions o;
  o.max_pending_requests = 0;
  o.prefix_caching = caching;
  o.metrics = metrics;
  o.draft_tokens = c.mtp || c.ngram ? 3 : 0;
  o.checkpoint_interval = caching ? c.interval : 0;
  return o;
}

// Each request alone on a cold engine (prefix caching off): what every cached run must give.
std::vector<Outcome> cold(const Config& c, const std::vector<GenerationRequest>& reqs) {
  const Tokenizer tok = letters_tokenizer();
  auto model = make_model(c);
  Engine engine(*model, tok, {kEos}, options(c, false, nullptr));
  std::vector<Outcome> out;
  for (const auto& r : reqs) {
    out.push_back(r.n > 1 ? collect_choices(*engine.submit(r), r.n)[0]
                          : collect(*engine.submit(r)));
    CHECK(out.back().error.empty() && out.back().timings.cache_n == 0);
  }
  return out;
}

void check_same(const std::vector<Outcome>& want, const std::vector<Outcome>& got,
                const std::string& what) {
  CHECK(want.size() == got.size());
  for (size_t i = 0; i < want.size(); ++i)
    if (!(got[i] == want[i]))
      fail(what + ": request " + std::to_string(i) + " gives '" + got[i].text + "' (" +
           got[i].finish + ") " + got[i].error + ", on a cold engine '" + want[i].text + "' (" +
           want[i].finish + ")");
}

std::vector<Outcome> run_together(Engine& engine, const std::vector<GenerationRequest>& reqs) {
  std::vector<std::shared_ptr<RequestState>> states;
  for (const auto& r : reqs) states.push_back(engine.submit(r));
  std::vector<Outcome> out;
  for (auto& st : states) out.push_back(collect(*st));
  return out;
}

std::string describe(const Config& c) {
  std::string s = c.recurrent ? "recurrent state" : "dense";
  if (c.mtp) s += ", MTP";
  if (c.align > 1) s += ", aligned to " + std::to_string(c.align);
  if (c.interval > 0) s += ", checkpoints every " + std::to_string(c.interval);
  if (c.ngram) s += ", n-gram";
  return s;
}

// An agent's conversation: a shared system prefix, then each turn's prompt is the last
// prompt, its reply and a new message. From the second turn on the prompt's cached part is
// what the last turn computed (dense: whole blocks; recurrent: up to the last checkpoint
// position of the last prompt), and the outputs are the cold engine's.
void test_multi_turn(const Config& c) {
  const Tokenizer tok = letters_tokenizer();
  std::mt19937 rng(3);
  const Tokens system = random_tokens(rng, 13);
  std::vector<GenerationRequest> turns;
  std::vector<Outcome> got;
  Metrics metrics;
  auto model = make_model(c);
  auto engine =
      std::make_unique<Engine>(*model, tok, std::vector<int32_t>{kEos}, options(c, true, &metrics));
  Tokens prompt = system;
  int64_t rows_cached = 0;
  for (int t = 0; t < 5; ++t) {
    const Tokens msg = random_tokens(rng, 3 + static_cast<int>(rng() % 6));
    prompt.insert(prompt.end(), msg.begin(), msg.end());
    GenerationRequest r = request(prompt, 4 + t, t);
    r.ignore_eos = true;
    r.sampling.temperature = 0;
    const int64_t rows0 = model->rows_.load();
    got.push_back(collect(*engine->submit(r)));
    const Outcome& o = got.back();
    CHECK(o.error.empty() && o.finish == "length");
    const int n = static_cast<int>(prompt.size());
    if (t == 0) {
      CHECK(o.timings.cache_n == 0);
    } else {
      const int prev = static_cast<int>(turns.back().prompt.size());
      const int prev_computed = prev + got[t - 1].timings.predicted_n - 1;
      int want;
      if (c.recurrent) want = (prev - 1) / c.granularity() * c.granularity();  // last checkpoint
      else want = std::min(n - 1, prev_computed) / c.block * c.block;
      // MTP: blocks are published after the head's pass over a step (a finished sequence's
      // last step, with its accepted drafts, has none) and a block's hash needs the token
      // after it: at least the last prompt's blocks
      const int least = c.mtp ? (prev - 1) / c.block * c.block : want;
      if (o.timings.cache_n > want || o.timings.cache_n < least)
        fail(describe(c) + " turn " + std::to_string(t) + ": " + std::to_string(o.timings.cache_n) +
             " prompt tokens cached, expected " +
             (least < want ? std::to_string(least) + ".." : "") + std::to_string(want));
      want = o.timings.cache_n;
      // Cached positions are not computed again (speculation adds draft rows).
      if (!c.mtp && !c.ngram)
        CHECK(model->rows_.load() - rows0 == n - want + o.timings.predicted_n - 1);
      rows_cached += want;
    }
    turns.push_back(r);
    prompt.insert(prompt.end(), o.tokens.begin(), o.tokens.end());
  }
  engine.reset();  // its loop has published the last step's metrics
  check_same(cold(c, turns), got, describe(c) + " multi-turn");
  const std::string text = metrics.render();
  CHECK(metric(text, "ninfer:prefix_cache_hits_total") == rows_cached);
  CHECK(metric(text, "ninfer:kv_blocks_used") == 0);
  if (c.recurrent) {
    CHECK(model->copies_.load() > 0);
    CHECK(metric(text, "ninfer:state_checkpoints_used") >= 1);
    CHECK(metric(text, "ninfer:state_checkpoints_total") == c.checkpoints);
  }
}

// Four streams sharing a prefix at once: first on an empty cache (each computes it; the
// duplicates stay private), then after a request left it cached (each starts from it).
void test_four_streams(const Config& c) {
  const Tokenizer tok = letters_tokenizer();
  std::mt19937 rng(8);
  const Tokens prefix = random_tokens(rng, 29);
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 9; ++i) {
    Tokens p = prefix;
    const Tokens tail = random_tokens(rng, 2 + i % 5);
    p.insert(p.end(), tail.begin(), tail.end());
    reqs.push_back(request(p, 6 + i % 4, i));
  }
  const auto want = cold(c, reqs);
  auto model = make_model(c);
  Metrics metrics;
  auto engine =
      std::make_unique<Engine>(*model, tok, std::vector<int32_t>{kEos}, options(c, true, &metrics));
  auto batch = [&](size_t from, size_t n) {
    std::vector<GenerationRequest> part(reqs.begin() + from, reqs.begin() + from + n);
    return run_together(*engine, part);
  };
  std::vector<Outcome> got = batch(0, 4);
  const std::vector<Outcome> one = batch(4, 1);
  got.insert(got.end(), one.begin(), one.end());
  const std::vector<Outcome> warm = batch(5, 4);
  got.insert(got.end(), warm.begin(), warm.end());
  engine.reset();
  check_same(want, got, describe(c) + " four streams");
  // the prefix's blocks; recurrent: its last checkpoint position
  const int least = c.recurrent ? 29 / c.granularity() * c.granularity() : 24;
  for (int i = 5; i < 9; ++i) CHECK(got[i].timings.cache_n >= least);
  CHECK(metric(metrics.render(), "ninfer:kv_blocks_used") == 0);
}

// Runs `reqs` `group` at a time on a caching engine over `c`'s model, checks every output
// against the cold engine's and that no block is left held; returns the metrics page.
std::string serve_in_groups(const Config& c, const std::vector<GenerationRequest>& reqs,
                            size_t group, const std::string& what) {
  const Tokenizer tok = letters_tokenizer();
  const auto want = cold(c, reqs);
  auto model = make_model(c);
  Metrics metrics;
  std::vector<Outcome> got;
  {
    Engine engine(*model, tok, {kEos}, options(c, true, &metrics));
    for (size_t i = 0; i < reqs.size(); i += group) {
      const size_t end = std::min(reqs.size(), i + group);
      const std::vector<GenerationRequest> part(reqs.begin() + i, reqs.begin() + end);
      const auto out = run_together(engine, part);
      got.insert(got.end(), out.begin(), out.end());
    }
  }
  check_same(want, got, describe(c) + " " + what);
  const std::string text = metrics.render();
  CHECK(metric(text, "ninfer:kv_blocks_used") == 0);
  CHECK(metric(text, "ninfer:prefix_cache_hits_total") > 0);
  return text;
}

// A pool that holds two requests: every new prompt evicts cached blocks, least recently
// used first, and the outputs stay the cold engine's; the families' prefixes come back.
void test_eviction(const Config& base) {
  Config c = base;
  c.concurrency = 2;
  c.kv_blocks = 1 + 2 * 24;
  std::mt19937 rng(21);
  const std::vector<GenerationRequest> reqs = family_requests(rng, {4, 24, 8}, 40, 9, {3, 12});
  const std::string text = serve_in_groups(c, reqs, 2, "eviction");
  CHECK(metric(text, "ninfer:prefix_cache_evictions_total") > 0);
}

// A pool too small for the running set: sequences holding shared cached blocks are
// preempted (the blocks stay with the others) and readmitted from the cache.
void test_preemption(const Config& base) {
  Config c = base;
  c.concurrency = 4;
  c.kv_blocks = 1 + 30;
  std::mt19937 rng(5);
  const Tokens prefix = random_tokens(rng, 20);
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 12; ++i) {
    GenerationRequest r = request(with_tail(prefix, rng, 1 + i % 6), 30 + i % 20, i);
    r.ignore_eos = true;
    reqs.push_back(r);
  }
  const std::string text = serve_in_groups(c, reqs, 4, "preemption");
  CHECK(metric(text, "ninfer:num_preemptions_total") > 0);
}

// A request that starts from the blocks of a prompt still being prefilled, whose request
// is then cancelled: the shared blocks stay with the survivor, which gives the cold
// engine's output.
void test_cancel_shared(const Config& c) {
  const Tokenizer tok = letters_tokenizer();
  std::mt19937 rng(13);
  const Tokens prompt = random_tokens(rng, 80);
  GenerationRequest a = request(prompt, 8, 0);
  Tokens pb(prompt.begin(), prompt.begin() + 40);
  const Tokens tail = random_tokens(rng, 5);
  pb.insert(pb.end(), tail.begin(), tail.end());
  GenerationRequest b = request(pb, 8, 1);
  const auto want = cold(c, {b});
  auto model = make_model(c);
  Gate gate;
  model->set_gate(&gate);
  Metrics metrics;
  auto engine =
      std::make_unique<Engine>(*model, tok, std::vector<int32_t>{kEos}, options(c, true, &metrics));
  auto sa = engine->submit(a);
  gate.allow(3);  // 48 of a's 80 prompt tokens: its first 12 blocks published
  gate.wait_held();
  auto sb = engine->submit(b);
  gate.allow(1);  // b admitted from a's blocks
  gate.wait_held();
  sa->cancel();
  gate.open();
  const Outcome ob = collect(*sb);
  const Outcome oa = collect(*sa);
  CHECK(oa.finish == "cancelled");
  engine.reset();
  check_same(want, {ob}, describe(c) + " cancelled sharer");
  // recurrent: a checkpoint in the middle of a's prompt only with an interval (chunks end
  // at each: b is admitted after a's fourth step of 8 rows); MTP: a block's hash covers the token
  // after it, and b's 41st differs from a's
  const int cached = c.recurrent ? (c.interval == 8 ? 32 : 0) : c.mtp ? 36 : 40;
  if (ob.timings.cache_n != cached)
    fail(describe(c) + ": the cancelled sharer's survivor found " +
         std::to_string(ob.timings.cache_n) + " tokens cached, expected " + std::to_string(cached));
  CHECK(metric(metrics.render(), "ninfer:kv_blocks_used") == 0);
}

// n > 1 from a cached prefix: every choice is what it is on a cold engine.
void test_choices(const Config& c) {
  const Tokenizer tok = letters_tokenizer();
  std::mt19937 rng(31);
  const Tokens prefix = random_tokens(rng, 26);
  Tokens p2 = prefix;
  const Tokens tail = random_tokens(rng, 6);
  p2.insert(p2.end(), tail.begin(), tail.end());
  GenerationRequest warm = request(prefix, 5, 0);
  GenerationRequest r = request(p2, 7, 1);
  r.n = 3;
  r.sampling.temperature = 0.9f;
  std::vector<std::vector<Outcome>> want, got;
  for (bool caching : {false, true}) {
    auto model = make_model(c);
    Engine engine(*model, tok, {kEos}, options(c, caching, nullptr));
    collect(*engine.submit(warm));
    (caching ? got : want).push_back(collect_choices(*engine.submit(r), 3));
  }
  for (int i = 0; i < 3; ++i) check_same({want[0][i]}, {got[0][i]}, describe(c) + " n = 3");
  CHECK(got[0][0].timings.cache_n == (c.recurrent ? 24 : 24));
}

// Many requests over a few shared prefixes, two to four at once, some cancelled: every
// finished one gives the cold engine's output, and no block or checkpoint is left held.
void test_soak(const Config& base) {
  Config c = base;
  c.kv_blocks = 1 + 40;
  const Tokenizer tok = letters_tokenizer();
  std::mt19937 rng(99);
  const std::vector<GenerationRequest> reqs = family_requests(rng, {5, 8, 7}, 600, 12, {1, 20});
  const auto want = cold(c, reqs);
  auto model = make_model(c);
  Metrics metrics;
  int cancelled = 0, checked = 0;
  {
    Engine engine(*model, tok, {kEos}, options(c, true, &metrics));
    for (size_t i = 0, n = 0; i < reqs.size(); i += n) {
      n = std::min<size_t>(2 + rng() % 3, reqs.size() - i);
      std::vector<std::shared_ptr<RequestState>> states;
      for (size_t j = 0; j < n; ++j) states.push_back(engine.submit(reqs[i + j]));
      const bool cancel = rng() % 8 == 0;
      if (cancel) states.back()->cancel();
      for (size_t j = 0; j < n; ++j) {
        const Outcome out = collect(*states[j]);
        if (!out.error.empty()) fail("soak request failed: " + out.error);
        if (out.finish == "cancelled") {
          ++cancelled;
          continue;
        }
        check_same({want[i + j]}, {out}, describe(c) + " soak");
        ++checked;
      }
    }
  }
  const std::string text = metrics.render();
  CHECK(metric(text, "ninfer:kv_blocks_used") == 0);
  CHECK(metric(text, "ninfer:num_requests_running") == 0);
  const double q = metric(text, "ninfer:prefix_cache_queries_total");
  const double h = metric(text, "ninfer:prefix_cache_hits_total");
  CHECK(h > 0 && h < q);
  if (c.recurrent) CHECK(metric(text, "ninfer:state_checkpoints_used") <= c.checkpoints);
  std::printf(
      "prefix soak (%s): %d checked, %d cancelled, %.0f of %.0f prompt tokens cached, "
      "%.0f evictions\n",
      describe(c).c_str(), checked, cancelled, h, q,
      metric(text, "ninfer:prefix_cache_evictions_total"));
}

}  // namespace

void test_prefix() {
  test_block_cache();
  test_scheduler_hits();
  std::vector<Config> configs(6);
  configs[1].ngram = true;
  configs[2].mtp = true;
  configs[3].recurrent = true;
  configs[3].checkpoints = 3;
  configs[4].recurrent = true;
  configs[4].checkpoints = 3;
  configs[4].ngram = true;
  configs[5].recurrent = true;  // the chunked Gated DeltaNet's alignment, and an interval
  configs[5].checkpoints = 8;
  configs[5].align = 8;
  configs[5].interval = 8;
  for (const Config& c : configs) {
    test_multi_turn(c);
    test_four_streams(c);
    test_eviction(c);
    test_preemption(c);
    test_cancel_shared(c);
    test_choices(c);
    test_soak(c);
  }
  std::printf("prefix ok\n");
}

}  // namespace ninfer::fake
