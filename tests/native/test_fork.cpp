// n > 1 in the engine against the fake model: a request's n choices equal n requests
// with seeds seed, seed + 1, ... (in every batching, chunking and preemption regime the
// invariance test uses); the prompt is prefilled once and its blocks shared (the fake
// model counts the rows it computes and refuses any write into a block two slots hold);
// every block comes back. Then the per-token features of the engine: stop_token_ids,
// min_tokens and logprobs.
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "harness.h"
#include "observe/metrics.h"

namespace ninfer::fake {
namespace {

// Forbids 'a' and records what it accepted in a log of its own, registered in `logs` (the
// log outlives the constraint, which the engine drops with its choice); its clones (one per
// other choice) register theirs. `cloneable` false: clone() says no.
class Recorder : public TokenConstraint {
 public:
  using Logs = std::vector<std::shared_ptr<std::vector<int32_t>>>;
  Recorder(Logs* logs, bool cloneable)
      : logs_(logs), seen_(std::make_shared<std::vector<int32_t>>()), cloneable_(cloneable) {
    logs_->push_back(seen_);
  }
  void apply(float* logits, int) override { logits[0] = -INFINITY; }
  bool accept(int32_t token) override {
    seen_->push_back(token);
    return token != 0;
  }
  std::shared_ptr<TokenConstraint> clone() override {
    if (!cloneable_) return nullptr;
    auto copy = std::make_shared<Recorder>(logs_, true);
    *copy->seen_ = *seen_;
    return copy;
  }

 private:
  Logs* logs_;
  std::shared_ptr<std::vector<int32_t>> seen_;
  bool cloneable_;
};

std::vector<GenerationRequest> fork_workload() {
  std::vector<GenerationRequest> reqs;
  std::mt19937 rng(11);
  // Prompt lengths around block boundaries (block size 4 and 1 below) and longer ones.
  const int lengths[] = {1, 3, 4, 5, 8, 9, 17, 24, 31, 33};
  for (int i = 0; i < 10; ++i) {
    GenerationRequest r;
    r.id = "fork-" + std::to_string(i);
    for (int t = 0; t < lengths[i]; ++t) r.prompt.push_back(rng() % 26);
    r.n = 2 + i % 3;
    r.max_tokens = 3 + rng() % 12;
    r.seed = 500 + 10 * i;
    if (i % 4 == 1) r.sampling.top_k = 6;
    if (i % 3 == 2) r.sampling.presence_penalty = 1.5f;
    if (i % 5 == 3) r.stop = {"k", "z"};
    r.ignore_eos = i % 2 == 0;
    reqs.push_back(r);
  }
  return reqs;
}

}  // namespace

void test_fork() {
  const Tokenizer tok = letters_tokenizer();
  const auto reqs = fork_workload();
  // Reference: every choice as a request of its own (n = 1, seed + i), one at a time.
  std::vector<std::vector<Outcome>> solo;
  {
    FakeModel model(4, 16, 1 + 4 * 16, 4, 64);
    EngineOptions o;
    o.max_concurrency = 1;
    Engine engine(model, tok, {kEos}, o);
    for (const auto& r : reqs) {
      std::vector<Outcome> choices;
      for (int i = 0; i < r.n; ++i) {
        GenerationRequest one = r;
        one.n = 1;
        one.seed = r.seed + i;
        choices.push_back(collect(*engine.submit(one)));
        CHECK(choices.back().error.empty());
      }
      solo.push_back(choices);
    }
  }
  const std::vector<Regime> configs = {
      {4, 16, 1 + 4 * 16, 4, false},  // roomy
      {4, 5, 1 + 4 * 16, 4, false},   // small steps: forks wait for the prefix over steps
      {4, 6, 1 + 14, 4, true},        // tight pool: forks and their leaders preempted
      {4, 7, 1 + 64, 1, false},       // one-token blocks
  };
  for (const Regime& c : configs) {
    FakeModel model(4, 16, c.kv_blocks, c.block_size, 64);
    Metrics metrics;
    const EngineOptions o = regime_options(c, &metrics);
    {
      Engine engine(model, tok, {kEos}, o);
      std::vector<std::shared_ptr<RequestState>> states;
      for (const auto& r : reqs) states.push_back(engine.submit(r));
      std::vector<std::vector<Outcome>> got(reqs.size());
      std::vector<std::thread> threads;
      for (size_t i = 0; i < reqs.size(); ++i)
        threads.emplace_back([&, i] { got[i] = collect_choices(*states[i], reqs[i].n); });
      for (auto& t : threads) t.join();
      for (size_t i = 0; i < reqs.size(); ++i)
        for (int k = 0; k < reqs[i].n; ++k)
          if (!(got[i][k] == solo[i][k]))
            fail("request " + std::to_string(i) + " choice " + std::to_string(k) +
                 " differs: alone '" + solo[i][k].text + "' (" + solo[i][k].finish +
                 ") as a choice '" + got[i][k].text + "' (" + got[i][k].finish + ") " +
                 got[i][k].error);
    }
    const std::string text = metrics.render();
    CHECK(metric(text, "ninfer:kv_blocks_used") == 0);  // every shared block came back
    if (c.expect_preemption) CHECK(metric(text, "ninfer:num_preemptions_total") > 0);
  }
  // The prompt is prefilled once: a 40-token prompt, 4 choices, blocks of 4. Each fork
  // shares blocks 0..8 (positions 0..35) and recomputes positions 36..39 itself.
  {
    FakeModel model(4, 16, 1 + 4 * 16, 4, 64);
    Engine engine(model, tok, {kEos}, EngineOptions{});
    GenerationRequest r;
    for (int t = 0; t < 40; ++t) r.prompt.push_back(t % 26);
    r.n = 4;
    r.max_tokens = 5;
    r.ignore_eos = true;
    r.seed = 3;
    const auto out = collect_choices(*engine.submit(r), 4);
    for (const Outcome& o : out) CHECK(o.finish == "length" && o.tokens.size() == 5);
    const int64_t rows = model.rows_.load();
    if (rows != 40 + 3 * 4 + 4 * 4)  // prefill, the forks' tails, 4 decode rows each
      fail("n=4 over a 40-token prompt computed " + std::to_string(rows) + " rows, not 68");
  }
  // Constraints per choice: choice 0 has the request's, each other one its own clone.
  {
    FakeModel model(4, 16, 1 + 4 * 16, 4, 64);
    Engine engine(model, tok, {kEos}, EngineOptions{});
    Recorder::Logs all;
    GenerationRequest r;
    r.prompt = {1, 2, 3};
    r.n = 3;
    r.max_tokens = 8;
    r.ignore_eos = true;
    r.seed = 9;
    r.constraints = {std::make_shared<Recorder>(&all, true)};
    const auto out = collect_choices(*engine.submit(r), 3);
    CHECK(all.size() == 3);
    for (int i = 0; i < 3; ++i) {
      CHECK(out[i].error.empty() && out[i].tokens.size() == 8);
      CHECK(*all[i] == out[i].tokens);  // its own choice's tokens, no others
      for (int32_t t : out[i].tokens) CHECK(t != 0);
    }
    CHECK(out[0].tokens != out[1].tokens || out[1].tokens != out[2].tokens);
    // A constraint that cannot be copied serves n = 1 only.
    r.constraints = {std::make_shared<Recorder>(&all, false)};
    bool refused = false;
    try {
      engine.submit(r);
    } catch (const std::invalid_argument&) {
      refused = true;
    }
    CHECK(refused);
    r.n = 1;
    CHECK(collect(*engine.submit(r)).error.empty());
  }
  std::puts("fork ok");
}

void test_token_controls() {
  const Tokenizer tok = letters_tokenizer();
  FakeModel model(4, 16, 1 + 4 * 16, 4, 64);
  Engine engine(model, tok, {kEos}, EngineOptions{});
  GenerationRequest base;
  base.prompt = {4, 5, 6};
  base.max_tokens = 30;
  base.sampling.temperature = 0;
  base.ignore_eos = true;
  const Outcome full = collect(*engine.submit(base));
  CHECK(full.tokens.size() == 30);
  // stop_token_ids: ends at the first occurrence, "stop", the token neither sent nor in
  // the text, counted in usage; also with ignore_eos.
  {
    const int32_t stop = full.tokens[7];
    size_t first = 0;
    while (full.tokens[first] != stop) ++first;
    GenerationRequest r = base;
    r.stop_token_ids = {stop};
    const Outcome o = collect(*engine.submit(r));
    CHECK(o.finish == "stop");
    CHECK(o.tokens == std::vector<int32_t>(full.tokens.begin(), full.tokens.begin() + first));
    CHECK(o.timings.predicted_n == static_cast<int>(first) + 1);
    // min_tokens past it: the stop token is masked until then, so greedy picks another.
    r.min_tokens = static_cast<int>(first) + 2;
    const Outcome later = collect(*engine.submit(r));
    CHECK(static_cast<int>(later.tokens.size()) >= r.min_tokens);
    for (int i = 0; i < r.min_tokens; ++i) CHECK(later.tokens[i] != stop);
  }
  // min_tokens masks the end-of-sequence token: find a greedy reply that ends on it (a
  // bias makes it win now and then; the mask holds whatever the bias).
  {
    GenerationRequest r = base;
    r.ignore_eos = false;
    r.sampling.logit_bias = {{kEos, 2.0f}};
    Outcome ended;
    for (int32_t a = 0; a < 26 && ended.finish != "stop"; ++a) {
      r.prompt = {a, 7};
      ended = collect(*engine.submit(r));
    }
    CHECK(ended.finish == "stop" && ended.timings.predicted_n == int(ended.tokens.size()) + 1);
    r.min_tokens = ended.timings.predicted_n + 3;
    const Outcome o = collect(*engine.submit(r));
    CHECK(static_cast<int>(o.tokens.size()) >= r.min_tokens);
    CHECK(std::vector<int32_t>(o.tokens.begin(), o.tokens.begin() + ended.tokens.size()) ==
          ended.tokens);  // the same until the masked end-of-sequence
  }
  // min_tokens holds stop strings off too (vLLM): a stop string that the first tokens
  // complete does not end the reply before min_tokens.
  {
    GenerationRequest r = base;
    r.max_tokens = 12;
    r.stop = {tok.decode({full.tokens[0]}, false)};
    CHECK(collect(*engine.submit(r)).tokens.size() <= 1);
    r.min_tokens = 6;
    const Outcome o = collect(*engine.submit(r));
    CHECK(o.tokens.size() >= 6 && o.finish == (o.tokens.size() == 12 ? "length" : "stop"));
  }
  // logprobs: one per sent token; greedy picks the top one; logprobs are of the raw model
  // distribution, so a logit_bias that changes the pick leaves them as they were.
  {
    GenerationRequest r = base;
    r.max_tokens = 6;
    r.logprobs = 5;
    auto st = engine.submit(r);
    std::vector<TokenLogprob> lps;
    for (;;) {
      GenerationEvent ev = st->next();
      if (ev.kind != GenerationEvent::Kind::kText) break;
      CHECK(ev.logprobs.size() == ev.tokens.size());
      for (size_t i = 0; i < ev.tokens.size(); ++i) CHECK(ev.logprobs[i].token == ev.tokens[i]);
      lps.insert(lps.end(), ev.logprobs.begin(), ev.logprobs.end());
    }
    CHECK(lps.size() == 6);
    double mass = 0;
    for (const TokenLogprob& lp : lps) {
      CHECK(lp.top.size() == 5 && lp.top[0].first == lp.token && lp.top[0].second == lp.logprob);
      for (size_t k = 1; k < lp.top.size(); ++k) CHECK(lp.top[k].second <= lp.top[k - 1].second);
      CHECK(lp.logprob <= 0);
      mass += std::exp(lp.logprob);
    }
    CHECK(mass > 0);
    GenerationRequest biased = r;
    biased.max_tokens = 1;
    biased.sampling.logit_bias = {{lps[0].top[1].first, 100.0f}};
    auto st2 = engine.submit(biased);
    GenerationEvent ev = st2->next();
    CHECK(ev.tokens.size() == 1 && ev.tokens[0] == lps[0].top[1].first);
    CHECK(ev.logprobs[0].logprob == lps[0].top[1].second);  // raw, not after the bias
    CHECK(ev.logprobs[0].top[0].first == lps[0].token);
  }
  std::puts("token_controls ok");
}

}  // namespace ninfer::fake
