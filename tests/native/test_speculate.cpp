// Speculative decoding's host pieces: the n-gram drafter (engine/ngram.h) against its
// rule, and a brute-force scan over random sequences; Sampler::verify (engine/sampling.h):
// greedy rows accept exactly the argmax, and in sampled rows the position's output follows
// the distribution sample() draws from, whatever the draft: a likely, an unlikely and an
// impossible draft proposed with certainty (q a point mass, as n-gram drafts are) and drafts
// drawn from a draft distribution q (as a draft model's are), after temperature, top_p,
// top_k, min_p and the penalties, 100,000 verifications each (sampling_stats.h's
// chi-square), and a certain draft is accepted at the rate p(draft).
//
// And the engine's speculative decoding against the fake model (whose logits depend on
// every token the KV pool holds for the row's sequence, so a draft row whose key/value
// survived a rejection, or a token fed at the wrong position, changes what follows):
// greedy outputs are those of plain decoding with n-gram, random and oracle drafts and with
// an MTP head's (the fake's draft(), which checks that the head saw every position with its
// next token and that its chain's blocks are held), at every concurrency, in a tight pool
// that preempts, with sequences of zero drafts beside others; drafts taken from the plain
// output are all accepted and save steps; a request cancelled while its verify step runs
// ends cleanly; a soak of a thousand requests leaves no KV block behind; a failing MTP pass
// ends the step's requests with its error and the engine serves on.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "drafters.h"
#include "engine/engine.h"
#include "engine/ngram.h"
#include "engine/sampling.h"
#include "engine/scheduler.h"
#include "harness.h"
#include "observe/metrics.h"
#include "sampling_stats.h"

namespace ninfer::fake {
namespace {

// The rule, by brute force: the longest n in [lo, hi] whose suffix n-gram occurs earlier
// (ending before the last token), at its earliest start; up to k tokens after it.
std::vector<int32_t> scan(const std::vector<int32_t>& t, int lo, int hi, int k) {
  const int len = static_cast<int>(t.size());
  for (int n = std::min(hi, len); n >= lo; --n)
    for (int i = 0; i + n <= len - 1; ++i) {
      bool match = true;
      for (int j = 0; j < n && match; ++j) match = t[i + j] == t[len - n + j];
      if (match) return {t.begin() + i + n, t.begin() + std::min(len, i + n + k)};
    }
  return {};
}

void test_ngram() {
  using V = std::vector<int32_t>;
  NgramDrafter d(2, 3);
  d.extend({1, 2, 3, 4, 2, 3});         // vLLM's example: [4, 2, 3] does not recur, [2, 3] does
  CHECK(d.propose(4) == (V{4, 2, 3}));  // only three tokens follow the match
  CHECK(d.propose(1) == (V{4}));
  CHECK(d.propose(0).empty());
  d.append(9);  // [3, 9] and [9] never occurred
  CHECK(d.propose(4).empty());
  NgramDrafter longest(1, 3);
  // [7, 8] recurs at 0 (followed by 1) and [6, 7, 8] at 4 (followed by 2): the longer wins
  longest.extend({7, 8, 1, 0, 6, 7, 8, 2, 5, 6, 7, 8});
  CHECK(longest.propose(2) == (V{2, 5}));
  NgramDrafter earliest(2, 2);
  earliest.extend({5, 6, 1, 5, 6, 2, 5, 6});  // [5, 6] at 0 and at 3: the earliest
  CHECK(earliest.propose(3) == (V{1, 5, 6}));
  NgramDrafter run(1, 4);
  run.extend({3, 3, 3, 3});  // overlapping occurrences: [3, 3, 3] at 0 is followed by 3
  CHECK(run.propose(5) == (V{3}));
  bool threw = false;
  try {
    NgramDrafter bad(3, 2);
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  CHECK(threw);
  std::mt19937 rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    const int vocab = 2 + trial % 7, lo = 1 + trial % 3, hi = lo + trial % 4;
    NgramDrafter drafter(lo, hi);
    std::vector<int32_t> tokens;
    std::uniform_int_distribution<int32_t> token(0, vocab - 1);
    for (int i = 0; i < 60; ++i) {
      const int32_t t = token(rng);
      tokens.push_back(t);
      drafter.append(t);
      for (int k : {1, 3, 8})
        if (drafter.propose(k) != scan(tokens, lo, hi, k))
          fail("n-gram draft differs from the scan at length " + std::to_string(tokens.size()));
    }
  }
}

// The position's output over `draws` verifications of drafts (`fixed_draft` proposed with
// certainty, or drawn from `q` when given), against exact_distribution; returns the
// acceptance rate.
double check_verify(const std::vector<float>& logits, const SamplingParams& p, int draws,
                    int32_t fixed_draft, const std::vector<float>* q, const std::string& what) {
  const int vocab = static_cast<int>(logits.size());
  const std::vector<double> want = exact_distribution(logits, p);
  std::vector<int> seen(vocab, 0);
  Sampler sampler(99);
  std::mt19937_64 draft_rng(5);
  std::discrete_distribution<int32_t> from_q;
  if (q) from_q = std::discrete_distribution<int32_t>(q->begin(), q->end());
  int accepted = 0;
  for (int i = 0; i < draws; ++i) {
    const int32_t draft = q ? from_q(draft_rng) : fixed_draft;
    const DraftVerdict v = sampler.verify(logits.data(), vocab, p, draft, q ? q->data() : nullptr);
    CHECK(!v.accepted || v.token == draft);
    accepted += v.accepted;
    ++seen[v.token];
  }
  check_draws(seen, want, draws, what);
  return static_cast<double>(accepted) / draws;
}

void test_verify() {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  const int vocab = 300;
  std::vector<float> logits(vocab);
  for (float& x : logits) x = normal(rng);
  // Greedy: the argmax, accepted iff drafted.
  Sampler greedy(1);
  SamplingParams g;
  g.temperature = 0;
  const int32_t best = argmax(logits.data(), vocab);
  for (int32_t draft : {best, (best + 1) % vocab}) {
    const DraftVerdict v = greedy.verify(logits.data(), vocab, g, draft);
    CHECK(v.token == best && v.accepted == (draft == best));
  }
  // A draft distribution of its own (a softened copy of the logits, shifted).
  std::vector<float> q(vocab);
  double qs = 0;
  for (int i = 0; i < vocab; ++i) qs += q[i] = std::exp(0.5 * logits[(i + 7) % vocab]);
  for (float& x : q) x = static_cast<float>(x / qs);
  std::vector<SamplingParams> settings(5);
  settings[1].temperature = 0.7f;
  settings[1].top_p = 0.9f;
  settings[2].top_k = 20;
  settings[2].temperature = 1.3f;
  settings[3].min_p = 0.1f;
  settings[3].temperature = 0.8f;
  settings[4].repetition_penalty = 1.3f;  // penalties change the logits before the sampler
  settings[4].frequency_penalty = 0.5f;
  settings[4].presence_penalty = 0.4f;
  settings[4].top_p = 0.95f;
  TokenCounts counts;
  counts.add_prompt({best, 5, 17});
  for (int32_t t : {best, best, 40}) counts.add_output(t);
  constexpr int kDraws = 100000;
  for (size_t s = 0; s < settings.size(); ++s) {
    const SamplingParams& p = settings[s];
    std::vector<float> row = logits;
    if (p.has_penalties()) counts.apply(row.data(), vocab, p);
    const std::vector<double> want = exact_distribution(row, p);
    int32_t likely = 0, unlikely = -1, impossible = -1;
    for (int i = 0; i < vocab; ++i) {
      if (want[i] > want[likely]) likely = i;
      if (want[i] > 0 && (unlikely < 0 || want[i] < want[unlikely])) unlikely = i;
      if (want[i] == 0) impossible = i;
    }
    const std::string what = "verify setting " + std::to_string(s);
    for (int32_t draft : {likely, unlikely, impossible}) {
      if (draft < 0) continue;  // every token possible: no impossible draft to try
      const double rate =
          check_verify(row, p, kDraws, draft, nullptr, what + ", draft " + std::to_string(draft));
      // accepted with probability p(draft): within 5 standard deviations
      const double sd = std::sqrt(want[draft] * (1 - want[draft]) / kDraws);
      if (std::abs(rate - want[draft]) > 5 * sd + 1e-9)
        fail(what + ": acceptance " + std::to_string(rate) + " for p(draft) " +
             std::to_string(want[draft]));
    }
    check_verify(row, p, kDraws, 0, &q, what + ", drafts from q");
  }
}

// Requests whose prompts repeat themselves (so n-gram lookup finds matches), of mixed
// lengths, greedy and sampled (temperature, top_p, top_k, min_p, seeds), some with
// penalties, min_tokens or logprobs (the processors see each draft row with the counts of
// the tokens accepted before it), some ended by EOS, one by a stop string, the others by
// length.
std::vector<GenerationRequest> spec_workload(int count, uint32_t seed) {
  std::vector<GenerationRequest> reqs;
  std::mt19937 rng(seed);
  for (int i = 0; i < count; ++i) {
    GenerationRequest r;
    r.id = "spec-" + std::to_string(i);
    const int motif = 2 + rng() % 5, reps = 1 + rng() % 5;
    std::vector<int32_t> m(motif);
    for (int32_t& t : m) t = rng() % 26;
    for (int k = 0; k < reps; ++k) r.prompt.insert(r.prompt.end(), m.begin(), m.end());
    r.max_tokens = 1 + rng() % 30;
    r.seed = 500 + i;
    r.sampling.temperature = i % 2 == 0 ? 0.0f : 0.9f;
    if (i % 4 == 1) r.sampling.top_p = 0.8f;
    if (i % 4 == 3) r.sampling.top_k = 6;
    if (i % 8 == 5) r.sampling.min_p = 0.05f;
    if (i % 5 == 2) {
      r.sampling.frequency_penalty = 0.8f;
      r.sampling.repetition_penalty = 1.3f;
    }
    if (i % 6 == 4) r.min_tokens = 3;
    if (i % 7 == 1) r.logprobs = 2;
    r.ignore_eos = i % 3 != 0;
    if (i % 7 == 3) r.stop = {"k"};
    reqs.push_back(r);
  }
  return reqs;
}

std::vector<Outcome> run_together(Engine& engine, const std::vector<GenerationRequest>& reqs) {
  std::vector<std::shared_ptr<RequestState>> states;
  for (const auto& r : reqs) states.push_back(engine.submit(r));
  std::vector<Outcome> out(reqs.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < reqs.size(); ++i)
    threads.emplace_back([&, i] { out[i] = collect(*states[i]); });
  for (auto& t : threads) t.join();
  return out;
}

// The reference: each request alone, without speculation.
std::vector<Outcome> plain(const std::vector<GenerationRequest>& reqs, const Tokenizer& tok) {
  FakeModel model(4, 16, 1 + 4 * 16, 4, 64);
  EngineOptions o;
  o.max_concurrency = 1;
  Engine engine(model, tok, {kEos}, o);
  std::vector<Outcome> out;
  for (const auto& r : reqs) out.push_back(collect(*engine.submit(r)));
  return out;
}

void check_same(const std::vector<Outcome>& want, const std::vector<Outcome>& got,
                const std::string& what) {
  for (size_t i = 0; i < want.size(); ++i) {
    if (!(got[i] == want[i]))
      fail(what + ": request " + std::to_string(i) + " gives '" + got[i].text + "' (" +
           got[i].finish + ") " + got[i].error + ", plain decoding '" + want[i].text + "' (" +
           want[i].finish + ")");
    CHECK(got[i].timings.predicted_n == want[i].timings.predicted_n);
  }
}

// Drafts leave prompts room: a step with a prompt to prefill keeps a row for it, and the
// waiting head's blocks stay free; without prompts drafts take what the step has.
void test_draft_budget() {
  SchedulerConfig c;
  c.max_concurrency = c.table_rows = 2;
  c.prefill_chunk = 6;
  c.kv_blocks = 1 + 8;
  c.block_size = 4;
  c.blocks_per_seq = 8;
  Scheduler sched(c);
  Sequence a;
  a.tokens = {1, 2, 3};
  sched.add(&a);
  StepPlan p = sched.plan();
  sched.commit(p);
  a.tokens.push_back(4);  // decoding: one token pending
  a.drafts = {5, 6, 7, 8, 9, 10, 11};
  p = sched.plan();  // nothing else to run: the drafts take the whole step
  CHECK(p.chunks.size() == 1 && p.chunks[0].drafts == 5 && p.rows == 6);
  CHECK(a.blocks.size() == 3);  // positions 0..8
  sched.commit(p);
  CHECK(a.num_computed == 4);  // draft rows count once accepted
  a.tokens.push_back(5);       // the engine appends the accepted draft, then accepts it
  sched.accept_draft(&a);
  CHECK(a.num_computed == 5);
  a.tokens.push_back(42);  // the verifier's token for the rejected second draft
  sched.drop_rejected(&a);
  CHECK(a.drafts.empty() && a.blocks.size() == 2);  // 6 positions: the third block is freed
  CHECK(sched.kv().used() == 2);
  Sequence b;
  b.tokens.assign(24, 3);  // a prompt of 6 blocks waits: every free block
  sched.add(&b);
  a.drafts = {1, 2, 3, 4, 5, 6};
  p = sched.plan();
  CHECK(p.chunks.size() == 2 && p.chunks[0].seq == &a && p.chunks[1].seq == &b);
  CHECK(p.chunks[0].drafts == 2);  // only within a's own blocks: b's are kept free
  CHECK(p.chunks[1].count == 3);   // b is admitted and its prompt gets the rest of the step
  sched.commit(p);
  a.tokens.push_back(7);  // no draft accepted
  sched.drop_rejected(&a);
  a.drafts = {1, 2, 3, 4, 5, 6};
  p = sched.plan();  // b prefilling: a row is kept for it, whatever the drafts
  CHECK(p.chunks.size() == 2 && p.chunks[1].seq == &b && p.chunks[1].count >= 1);
  CHECK(p.rows == 6 && p.chunks[0].count == 1 + p.chunks[0].drafts && p.chunks[0].drafts == 1);
  sched.remove(&a);
  sched.remove(&b);
  CHECK(sched.kv().used() == 0);
}

// Greedy and seeded sampled requests give the tokens of plain decoding, whatever the
// drafts (a certain draft is decided by the position's own draw: Sampler::verify).
void test_same_as_plain() {
  const Tokenizer tok = letters_tokenizer();
  const auto reqs = spec_workload(24, 5);
  const std::vector<Outcome> want = plain(reqs, tok);
  // The prompt and plain output of each request, with the EOS that ended it.
  std::vector<std::vector<int32_t>> refs;
  for (size_t i = 0; i < reqs.size(); ++i) {
    std::vector<int32_t> ref = reqs[i].prompt;
    ref.insert(ref.end(), want[i].tokens.begin(), want[i].tokens.end());
    if (want[i].timings.predicted_n > static_cast<int>(want[i].tokens.size())) ref.push_back(kEos);
    refs.push_back(ref);
  }
  enum class Source { kNgram, kRandom, kOracle, kPartial, kMtp, kMtpRandom, kMtpPartial };
  const std::vector<Regime> regimes = {
      {1, 16, 1 + 4 * 16, 4, false},                                 // one at a time
      {2, 16, 1 + 4 * 16, 4, false}, {4, 16, 1 + 4 * 16, 4, false},  // every slot
      {4, 7, 1 + 4 * 16, 4, false},  // a step too small for every draft
      {3, 9, 1 + 16, 4, true},       // tight pool: preemptions, drafts cut to free blocks
  };
  for (Source src : {Source::kNgram, Source::kRandom, Source::kOracle, Source::kPartial,
                     Source::kMtp, Source::kMtpRandom, Source::kMtpPartial})
    for (bool recurrent : {false, true}) {
      const char* name = src == Source::kNgram       ? "ngram"
                         : src == Source::kRandom    ? "random"
                         : src == Source::kOracle    ? "oracle"
                         : src == Source::kPartial   ? "partly wrong oracle"
                         : src == Source::kMtp       ? "MTP (the plain output's)"
                         : src == Source::kMtpRandom ? "MTP (random)"
                                                     : "MTP (partly wrong)";
      const bool mtp =
          src == Source::kMtp || src == Source::kMtpRandom || src == Source::kMtpPartial;
      for (const Regime& g : regimes) {
        FakeModel model(4, 16, g.kv_blocks, g.block_size, 64);
        // MTP: the model drafts (the engine holds its chains); the chain after a
        // sequence's tokens is the rest of its plain output (past its end: filler, counted
        // in `beyond`), with one draft replaced in turn (partly wrong), or random.
        int64_t beyond = 0, calls = 0;
        std::mt19937_64 draw(5);
        if (mtp)
          model.set_mtp(4, [&](const std::vector<int32_t>& seq, int count) {
            std::vector<int32_t> chain(static_cast<size_t>(count));
            if (src == Source::kMtpRandom) {
              for (int32_t& t : chain) t = static_cast<int32_t>(draw() % kVocab);
              return chain;
            }
            const std::vector<int32_t>* ref = nullptr;
            for (const auto& r : refs)
              if (r.size() >= seq.size() && std::equal(seq.begin(), seq.end(), r.begin())) {
                ref = &r;
                break;
              }
            if (ref == nullptr)
              fail("MTP head drafting for a sequence no plain output starts with");
            for (int k = 0; k < count; ++k) {
              const size_t at = seq.size() + static_cast<size_t>(k);
              if (at < ref->size()) {
                chain[k] = (*ref)[at];
              } else {
                chain[k] = 0;
                ++beyond;
              }
            }
            if (src == Source::kMtpPartial) {
              const int64_t miss = calls++ % (count + 1);
              if (miss < count) chain[miss] = (chain[miss] + 1) % kVocab;
            }
            return chain;
          });
        else model.set_spec(4);
        if (recurrent) model.set_recurrent();
        Metrics metrics;
        EngineOptions o = regime_options(g, &metrics);
        o.draft_tokens = 4;
        if (src == Source::kRandom)
          o.drafter = [](const GenerationRequest& r, int) {
            return std::make_unique<RandomDrafter>(std::hash<std::string>()(r.id));
          };
        if (src == Source::kOracle || src == Source::kPartial)
          o.drafter = [&](const GenerationRequest& r, int) {
            return std::make_unique<OracleDrafter>(refs[std::stoi(r.id.substr(5))],
                                                   src == Source::kPartial);
          };
        std::vector<Outcome> got;
        {
          Engine engine(model, tok, {kEos}, o);
          got = run_together(engine, reqs);
        }
        const std::string what = std::string(name) + " drafts" +
                                 (recurrent ? " (recurrent state)" : "") + ", concurrency " +
                                 std::to_string(g.concurrency) + ", chunk " +
                                 std::to_string(g.prefill_chunk);
        check_same(want, got, what);
        const std::string text = metrics.render();
        CHECK(metric(text, "ninfer:kv_blocks_used") == 0);
        CHECK(model.max_rows_.load() <= g.prefill_chunk);
        if (g.expect_preemption) CHECK(metric(text, "ninfer:num_preemptions_total") > 0);
        const double drafted = metric(text, "ninfer:spec_decode_num_draft_tokens_total");
        const double accepted = metric(text, "ninfer:spec_decode_num_accepted_tokens_total");
        int drafted_req = 0, accepted_req = 0;
        for (const Outcome& out : got) {
          CHECK(out.timings.draft_n >= out.timings.draft_accepted_n);
          drafted_req += out.timings.draft_n;
          accepted_req += out.timings.draft_accepted_n;
        }
        CHECK(drafted == drafted_req && accepted == accepted_req);
        CHECK(drafted > 0);  // the path ran
        if (mtp) CHECK(model.drafts_.load() > 0 && model.chained_ >= drafted);
        if (src == Source::kMtp) {
          // Every draft the plain output holds is accepted; only filler past a request's
          // end is not.
          if (drafted - accepted > static_cast<double>(beyond) || accepted == 0)
            fail(what + ": " + std::to_string(accepted) + " of " + std::to_string(drafted) +
                 " MTP drafts accepted, " + std::to_string(beyond) + " past the end");
          CHECK(metric(text,
                       "ninfer:spec_decode_num_accepted_tokens_per_pos_total{position=\"3\"}") > 0);
        }
        if (src == Source::kOracle) {
          // Drafts from the plain output are all accepted (sampled requests' too: the same
          // draws), and save steps.
          if (accepted != drafted)
            fail(what + ": " + std::to_string(accepted) + " of " + std::to_string(drafted) +
                 " oracle drafts accepted");
          CHECK(metric(text,
                       "ninfer:spec_decode_num_accepted_tokens_per_pos_total{position=\"3\"}") > 0);
        }
        if (src == Source::kRandom || src == Source::kMtpRandom) CHECK(accepted < drafted);
        if (src == Source::kPartial || src == Source::kMtpPartial) {  // stopped at each position
          CHECK(accepted < drafted);
          for (int pos = 0; pos < 3; ++pos)
            CHECK(metric(text, "ninfer:spec_decode_num_accepted_tokens_per_pos_total{position=\"" +
                                   std::to_string(pos) + "\"}") > 0);
        }
      }
    }
  // The oracle's saving, in steps: one request alone, plain and with all drafts accepted.
  GenerationRequest r = reqs[1];
  r.max_tokens = 30;
  r.ignore_eos = true;
  r.stop.clear();
  const std::vector<Outcome> one = plain({r}, tok);
  std::vector<int32_t> ref = r.prompt;
  ref.insert(ref.end(), one[0].tokens.begin(), one[0].tokens.end());
  FakeModel model(4, 16, 1 + 4 * 16, 4, 64);
  model.set_spec(4);
  EngineOptions o;
  o.draft_tokens = 4;
  o.drafter = [&](const GenerationRequest&, int) { return std::make_unique<OracleDrafter>(ref); };
  {
    Engine engine(model, tok, {kEos}, o);
    CHECK(collect(*engine.submit(r)) == one[0]);
  }
  // the prompt step gives a token, then each step 1 + 4 tokens: 1 + ceil(29 / 5) steps
  CHECK(model.steps_.load() == 1 + (29 + 4) / 5);
}

// Cancelled while the model runs a step that verifies its drafts: the step's tokens are
// still sent, then the request ends "cancelled" with its blocks freed.
void test_cancel_in_verify(bool recurrent, bool mtp) {
  const Tokenizer tok = letters_tokenizer();
  FakeModel model(2, 16, 1 + 2 * 16, 4, 64);
  if (mtp) model.set_mtp(3, random_mtp(9));
  else model.set_spec(3);
  if (recurrent) model.set_recurrent();
  Gate gate;
  model.set_gate(&gate);
  Metrics metrics;
  EngineOptions o;
  o.metrics = &metrics;
  o.draft_tokens = 3;
  if (!mtp)
    o.drafter = [](const GenerationRequest&, int) {
      return std::make_unique<RandomDrafter>(9, /*always=*/true);
    };
  {
    Engine engine(model, tok, {kEos}, o);
    GenerationRequest r;
    r.id = "cancel";
    r.prompt = {1, 2, 3};
    r.max_tokens = 50;
    r.ignore_eos = true;
    auto st = engine.submit(r);
    gate.allow(6);
    gate.wait_held();  // inside step 7
    std::vector<FakeModel::StepRows> h = model.history();
    CHECK(h.size() == 6);
    st->cancel();
    gate.open();
    const Outcome out = collect(*st);
    CHECK(out.finish == "cancelled" && out.error.empty());
    CHECK(out.timings.draft_n > 0);
    h = model.history();
    CHECK(h.size() == 7 && h[6].seqs == 1 && h[6].rows == 4);  // step 7 verified 3 drafts
  }
  CHECK(metric(metrics.render(), "ninfer:kv_blocks_used") == 0);
}

// Two to four streams at once, a thousand requests of mixed lengths and sampling, n-gram
// drafts, some cancelled mid-way: nothing fails and no block is left behind.
void test_soak(bool recurrent, bool mtp) {
  const Tokenizer tok = letters_tokenizer();
  FakeModel model(4, 12, 1 + 24, 4, 64);
  if (mtp) model.set_mtp(4, random_mtp(23));
  else model.set_spec(4);
  if (recurrent) model.set_recurrent();
  Metrics metrics;
  EngineOptions o;
  o.metrics = &metrics;
  o.max_pending_requests = 0;
  o.draft_tokens = 4;
  std::mt19937 rng(17);
  int done = 0, cancelled = 0;
  {
    Engine engine(model, tok, {kEos}, o);
    auto reqs = spec_workload(1000, 23);
    for (size_t i = 0, n = 0; i < reqs.size(); i += n) {
      n = std::min<size_t>(2 + rng() % 3, reqs.size() - i);
      std::vector<std::shared_ptr<RequestState>> states;
      for (size_t j = 0; j < n; ++j) {
        states.push_back(engine.submit(reqs[i + j]));
      }
      if (rng() % 10 == 0) states.back()->cancel();
      for (auto& st : states) {
        const Outcome out = collect(*st);
        if (!out.error.empty()) fail("soak request failed: " + out.error);
        (out.finish == "cancelled" ? cancelled : done) += 1;
      }
    }
  }
  const std::string text = metrics.render();
  CHECK(metric(text, "ninfer:kv_blocks_used") == 0);
  CHECK(metric(text, "ninfer:num_requests_running") == 0);
  CHECK(metric(text, "ninfer:spec_decode_num_accepted_tokens_total") > 0);
  CHECK(done > 0);
  std::printf("soak%s%s: %d finished, %d cancelled, %.0f of %.0f drafts accepted\n",
              mtp ? " (MTP)" : "", recurrent ? " (recurrent state)" : "", done, cancelled,
              metric(text, "ninfer:spec_decode_num_accepted_tokens_total"),
              metric(text, "ninfer:spec_decode_num_draft_tokens_total"));
}

// The MTP head fails (a device error in the draft pass): the step's sequences end with an
// error that says so, their blocks are freed, and the engine serves on.
void test_mtp_failure() {
  const Tokenizer tok = letters_tokenizer();
  FakeModel model(2, 16, 1 + 2 * 16, 4, 64);
  model.set_mtp(3, random_mtp(3));
  model.fail_draft_at_ = 4;
  Metrics metrics;
  EngineOptions o;
  o.metrics = &metrics;
  o.draft_tokens = 3;
  {
    Engine engine(model, tok, {kEos}, o);
    std::vector<GenerationRequest> reqs(2);
    for (size_t i = 0; i < reqs.size(); ++i) {
      reqs[i].id = "mtp-fail-" + std::to_string(i);
      reqs[i].prompt = {1, 2, static_cast<int32_t>(3 + i)};
      reqs[i].max_tokens = 40;
      reqs[i].ignore_eos = true;
    }
    for (const Outcome& out : run_together(engine, reqs))
      if (out.error.find("MTP draft step failed: draft head lost") == std::string::npos)
        fail("a request beside a failed MTP pass ends with '" + out.error + "' (" + out.finish +
             ")");
    model.fail_draft_at_ = -1;  // the head works again: the next request is served
    GenerationRequest r = reqs[0];
    r.id = "after";
    const Outcome out = collect(*engine.submit(r));
    CHECK(out.error.empty() && out.timings.predicted_n == 40);
  }
  CHECK(metric(metrics.render(), "ninfer:kv_blocks_used") == 0);
}

}  // namespace

void test_speculate() {
  test_ngram();
  test_verify();
  test_draft_budget();
  test_same_as_plain();
  for (bool mtp : {false, true})
    for (bool recurrent : {false, true}) {
      test_cancel_in_verify(recurrent, mtp);
      test_soak(recurrent, mtp);
    }
  test_mtp_failure();
  std::printf("speculate ok\n");
}

}  // namespace ninfer::fake
