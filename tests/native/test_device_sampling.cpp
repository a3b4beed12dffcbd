// The engine's device-sampling path (Model::samples_on_device) without a GPU: the fake
// model keeps its logits "on the device" and samples them with the device sampler's exact
// source (templates/cuda/sampler.cu.j2, rendered by tests/native_build.py into
// sampler_kernel.h) run under the CUDA emulation (tests/kernels/cuda_emulation.h), fed by
// model/sample_pack.h as the generated CUDA model feeds it. So what is tested is the
// engine's row building: edits (min_tokens, logit_bias, penalties), constraint bitmasks,
// seeds and counters.
//
// usage: test_device_sampling   (prints "device sampling ok")
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "drafters.h"
#include "engine/engine.h"
#include "harness.h"
#include "model/sample_pack.h"
#include "sampler_kernel.h"

namespace ninfer::fake {
namespace {

class DeviceFake : public FakeModel {
 public:
  using FakeModel::FakeModel;
  bool samples_on_device() const override { return true; }
  void launch(const StepBatch& b) override {
    m_ = b.n_logits;
    logits_.assign(static_cast<size_t>(m_ + 1) * kVocab, 0.0f);
    step(b, logits_.data());
  }
  void sample(const SampleRow* rows, SampledToken* out) override {
    CHECK(m_ >= 0 && m_ <= kSamplerMaxRows);
    const int m = m_;
    m_ = -1;
    pack_.pack(rows, m, kSamplerTop, kSamplerMaxEdits, kSamplerWords);
    // The device buffers at their full size, as the generated model allocates them.
    pack_.edit_ids.resize(static_cast<size_t>(kSamplerMaxEdits) * 2);
    pack_.edit_vals.resize(static_cast<size_t>(kSamplerMaxEdits) * 3);
    pack_.masks.resize(static_cast<size_t>(kSamplerMaxRows) * kSamplerWords);
    std::vector<int32_t> ids(static_cast<size_t>(m) * (kSamplerTop + 1), -7);
    std::vector<float> lps(ids.size(), std::nanf(""));
    std::vector<float> work(static_cast<size_t>(m) * kVocab, std::nanf(""));
    emulated_sampler(logits_.data(), pack_.fparams.data(), pack_.iparams.data(),
                     pack_.edit_ids.data(), pack_.edit_vals.data(), pack_.masks.data(), ids.data(),
                     lps.data(), work.data(), m);
    SamplePack::unpack(rows, m, kSamplerTop, ids.data(), lps.data(), out);
    rows_sampled += m;
    for (int k = 0; k < m; ++k) draws.emplace_back(rows[k].seed, rows[k].counter);
  }
  int rows_sampled = 0;
  std::vector<std::pair<uint64_t, uint64_t>> draws;  // (seed, counter) of every row

 private:
  int m_ = -1;
  std::vector<float> logits_;
  SamplePack pack_;
};

// Forbids every token outside `allowed` (the default fill_bitmask runs apply()).
class OnlyTokens : public TokenConstraint {
 public:
  explicit OnlyTokens(std::vector<int32_t> allowed) : allowed_(std::move(allowed)) {}
  void apply(float* logits, int vocab) override {
    for (int id = 0; id < vocab; ++id)
      if (std::find(allowed_.begin(), allowed_.end(), id) == allowed_.end())
        logits[id] = -std::numeric_limits<float>::infinity();
  }
  bool accept(int32_t token) override {
    return std::find(allowed_.begin(), allowed_.end(), token) != allowed_.end();
  }

 private:
  std::vector<int32_t> allowed_;
};

struct Result {
  Outcome outcome;
  std::vector<TokenLogprob> logprobs;
};

Result run(Model& model, const GenerationRequest& r, const EngineOptions& options = {}) {
  Tokenizer tok = letters_tokenizer();
  Engine engine(model, tok, {kEos}, options);
  auto st = engine.submit(r);
  Result res;
  for (int done = 0;;) {
    GenerationEvent ev;
    CHECK(st->next_for(60000, ev));
    if (ev.kind == GenerationEvent::Kind::kError) {
      res.outcome.error = ev.error;
      return res;
    }
    if (ev.kind == GenerationEvent::Kind::kDone) {
      res.outcome.finish = ev.finish_reason;
      if (++done == r.n) return res;  // every choice ended
      continue;
    }
    res.outcome.text += ev.text;
    res.outcome.tokens.insert(res.outcome.tokens.end(), ev.tokens.begin(), ev.tokens.end());
    res.logprobs.insert(res.logprobs.end(), ev.logprobs.begin(), ev.logprobs.end());
  }
}

GenerationRequest request(uint64_t seed, int max_tokens) {
  GenerationRequest r;
  r.id = "r" + std::to_string(seed);
  r.prompt = {7, 4, 11, 11, 14, 22, 14, 17, 11, 3};
  r.max_tokens = max_tokens;
  r.seed = seed;
  return r;
}

// Greedy rows choose the host's token whatever the processors: so every edit and mask
// the engine builds must equal what process_logits applies on the host.
void test_greedy_matches_host() {
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 6; ++i) {
    GenerationRequest r = request(10 + i, 24);
    r.sampling.temperature = 0;
    r.ignore_eos = i % 2 == 0;
    if (i == 1 || i == 5) {
      r.sampling.repetition_penalty = 1.4f;
      r.sampling.frequency_penalty = 0.6f;
      r.sampling.presence_penalty = 0.3f;
    }
    if (i == 2 || i == 5) r.sampling.logit_bias = {{4, 2.5f}, {kEos, -1.0f}, {0, 0.75f}};
    if (i == 3) {
      r.min_tokens = 12;
      r.stop_token_ids = {4, 14};
    }
    if (i == 4 || i == 5)
      r.constraints = {std::make_shared<OnlyTokens>(std::vector<int32_t>{0, 4, 8, 14, 20, kEos})};
    if (i == 5) r.logprobs = 5;
    reqs.push_back(r);
  }
  for (const auto& r : reqs) {
    FakeModel host(4, 16, 1 + 4 * 16, 4, 64);
    DeviceFake device(4, 16, 1 + 4 * 16, 4, 64);
    GenerationRequest hr = r, dr = r;
    if (!r.constraints.empty()) {  // a constraint has state: one each
      hr.constraints = {std::make_shared<OnlyTokens>(std::vector<int32_t>{0, 4, 8, 14, 20, kEos})};
      dr.constraints = {std::make_shared<OnlyTokens>(std::vector<int32_t>{0, 4, 8, 14, 20, kEos})};
    }
    const Result h = run(host, hr), d = run(device, dr);
    CHECK(h.outcome.error.empty() && d.outcome.error.empty());
    CHECK(h.outcome == d.outcome);
    CHECK(!d.outcome.tokens.empty() && device.rows_sampled > 0);
    CHECK(h.logprobs.size() == d.logprobs.size());
    for (size_t t = 0; t < h.logprobs.size(); ++t) {
      CHECK(h.logprobs[t].token == d.logprobs[t].token);
      CHECK(std::abs(h.logprobs[t].logprob - d.logprobs[t].logprob) < 1e-5f);
      CHECK(h.logprobs[t].top.size() == 5 && d.logprobs[t].top.size() == 5);
      for (int j = 0; j < 5; ++j) {
        CHECK(h.logprobs[t].top[j].first == d.logprobs[t].top[j].first);
        CHECK(std::abs(h.logprobs[t].top[j].second - d.logprobs[t].top[j].second) < 1e-5f);
      }
    }
  }
}

// Sampled rows: the seed and the token index decide the draw, so a request repeats
// exactly and another seed draws otherwise; constraints hold on sampled rows.
void test_seeds_counters_and_masks() {
  auto sampled = [](uint64_t seed, int n) {
    GenerationRequest r = request(seed, 20);
    r.ignore_eos = true;
    r.sampling.top_p = 0.9f;
    r.n = n;
    return r;
  };
  DeviceFake a(4, 16, 1 + 4 * 16, 4, 64), b(4, 16, 1 + 4 * 16, 4, 64);
  const Result first = run(a, sampled(5, 1)), again = run(b, sampled(5, 1));
  CHECK(first.outcome.tokens.size() == 20 && first.outcome == again.outcome);
  DeviceFake c(4, 16, 1 + 4 * 16, 4, 64);
  const Result other = run(c, sampled(6, 1));
  CHECK(!(other.outcome == first.outcome));
  // Choice i draws with seed + i, at counter = its token index (0, 1, ...).
  DeviceFake forked(4, 16, 1 + 4 * 16, 4, 64);
  run(forked, sampled(40, 2));
  std::vector<std::pair<uint64_t, uint64_t>> want;
  for (uint64_t seed : {40, 41})
    for (uint64_t t = 0; t < 20; ++t) want.emplace_back(seed, t);
  std::sort(forked.draws.begin(), forked.draws.end());
  CHECK(forked.draws == want);
  // Every token of a constrained, sampled request is one the constraint allows.
  GenerationRequest r = sampled(9, 1);
  r.sampling.temperature = 1.5f;
  r.constraints = {std::make_shared<OnlyTokens>(std::vector<int32_t>{1, 3, 5})};
  DeviceFake d(4, 16, 1 + 4 * 16, 4, 64);
  const Result masked = run(d, r);
  CHECK(masked.outcome.error.empty() && masked.outcome.tokens.size() == 20);
  int seen[3] = {0, 0, 0};
  for (int32_t t : masked.outcome.tokens) {
    CHECK(t == 1 || t == 3 || t == 5);
    ++seen[t / 2];
  }
  CHECK(seen[0] + seen[1] + seen[2] == 20 && (seen[0] < 20 && seen[1] < 20 && seen[2] < 20));
}

// Speculation on the device: every row of a sequence's drafts is sampled with the counter
// and penalty counts of its position as if the drafts before it were accepted, so a draft
// is accepted iff the draw at its position equals it; greedy and sampled requests (with
// penalties, min_tokens, logprobs) give the tokens and logprobs of plain device decoding,
// with drafts from the plain output (all accepted, fewer steps) and with n-gram drafts.
// A constrained request decodes without drafts there.
void test_speculation() {
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 8; ++i) {
    GenerationRequest r = request(30 + i, 10 + 3 * i);
    r.prompt = {7, 4, 11, 7, 4, 11, 7, 4, 11, 3};  // repeats: n-gram drafts find matches
    r.sampling.temperature = i % 2 == 0 ? 0.0f : 0.9f;
    r.ignore_eos = i % 3 != 0;
    if (i % 4 == 1) r.sampling.top_p = 0.85f;
    if (i == 2 || i == 5) {
      r.sampling.repetition_penalty = 1.3f;
      r.sampling.frequency_penalty = 0.7f;
      r.sampling.presence_penalty = 0.2f;
    }
    if (i == 3) r.min_tokens = 6;
    if (i == 5) r.logprobs = 3;
    if (i == 7) r.constraints = {std::make_shared<OnlyTokens>(std::vector<int32_t>{0, 7, 11})};
    reqs.push_back(r);
  }
  for (const GenerationRequest& r : reqs) {
    DeviceFake plain_model(4, 16, 1 + 4 * 16, 4, 64);
    const Result plain = run(plain_model, r);
    CHECK(plain.outcome.error.empty() && !plain.outcome.tokens.empty());
    std::vector<int32_t> ref = r.prompt;
    ref.insert(ref.end(), plain.outcome.tokens.begin(), plain.outcome.tokens.end());
    if (plain.outcome.finish == "stop") ref.push_back(kEos);
    for (bool oracle : {true, false}) {
      DeviceFake model(4, 16, 1 + 4 * 16, 4, 64);
      model.set_spec(4);
      EngineOptions o;
      o.draft_tokens = 4;
      if (oracle)
        o.drafter = [&](const GenerationRequest&, int) {
          return std::make_unique<OracleDrafter>(ref);
        };
      GenerationRequest sr = r;
      if (!r.constraints.empty())
        sr.constraints = {std::make_shared<OnlyTokens>(std::vector<int32_t>{0, 7, 11})};
      const Result got = run(model, sr, o);
      if (!(got.outcome == plain.outcome))
        fail("request " + r.id + (oracle ? " (oracle drafts)" : " (n-gram drafts)") +
             " differs from plain device decoding: '" + got.outcome.text + "' against '" +
             plain.outcome.text + "' " + got.outcome.error);
      CHECK(got.logprobs.size() == plain.logprobs.size());
      for (size_t t = 0; t < got.logprobs.size(); ++t) {
        CHECK(got.logprobs[t].token == plain.logprobs[t].token);
        CHECK(std::abs(got.logprobs[t].logprob - plain.logprobs[t].logprob) < 1e-6f);
      }
      const bool drafts = r.constraints.empty() && plain.outcome.tokens.size() > 1;
      if (oracle && drafts) CHECK(model.steps_.load() < plain_model.steps_.load());
      if (!drafts) CHECK(model.steps_.load() == plain_model.steps_.load());
    }
  }
}

// A row with every token masked fails its request with the host sampler's message.
void test_all_masked() {
  for (bool device : {false, true}) {
    GenerationRequest r = request(3, 5);
    r.constraints = {std::make_shared<OnlyTokens>(std::vector<int32_t>{})};
    std::unique_ptr<FakeModel> m = device ? std::make_unique<DeviceFake>(4, 16, 1 + 4 * 16, 4, 64)
                                          : std::make_unique<FakeModel>(4, 16, 1 + 4 * 16, 4, 64);
    CHECK(run(*m, r).outcome.error == kAllMaskedError);
  }
}

}  // namespace
}  // namespace ninfer::fake

int main() {
  using namespace ninfer::fake;
  test_greedy_matches_host();
  test_seeds_counters_and_masks();
  test_all_masked();
  test_speculation();
  std::printf("device sampling ok\n");
  return 0;
}
