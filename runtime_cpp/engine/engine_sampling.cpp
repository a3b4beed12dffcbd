// The Engine's sampling of a step's rows: the request's logits processors and Sampler on
// the host, or the same as parameters of the device sampler's row.
#include <algorithm>
#include <limits>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/engine.h"
#include "engine/engine_seq.h"

namespace ninfer {

// The row the device sampler draws s's next token from: what process_logits and
// Sampler::sample do on the host, as parameters, one merged edit per token (min_tokens
// masking, logit_bias, penalties) and the AND of the constraints' bitmasks.
// Draft row j > 0 (speculation) describes the position after s.drafts[0..j-1], as if they
// were accepted (when one is not, the rows after it are dropped): its counter, min_tokens
// and penalty counts include them. (Constrained requests get no drafts on the device.)
void Engine::device_row(Seq& s, int k, int j) {
  const GenerationRequest& req = s.state->request;
  const SamplingParams& p = req.sampling;
  const int vocab = model_.info().vocab_size;
  const int generated = s.generated + j;
  std::vector<SampleEdit>& edits = sample_edits_[k];
  edits.clear();
  edit_index_.clear();
  auto edit = [&](int32_t id) -> SampleEdit* {
    if (id < 0 || id >= vocab) return nullptr;
    auto [it, fresh] = edit_index_.emplace(id, static_cast<int>(edits.size()));
    if (fresh) edits.push_back(SampleEdit{id});
    return &edits[it->second];
  };
  if (generated < req.min_tokens) {
    if (!req.ignore_eos)
      for (int32_t id : eos_ids_)
        if (SampleEdit* e = edit(id)) e->flags |= SampleEdit::kMask;
    for (int32_t id : req.stop_token_ids)
      if (SampleEdit* e = edit(id)) e->flags |= SampleEdit::kMask;
  }
  for (const auto& [id, bias] : p.logit_bias)  // ids are unique (a JSON object's keys)
    if (SampleEdit* e = edit(id)) {
      e->flags |= SampleEdit::kBias;
      e->bias += bias;
    }
  if (p.has_penalties()) {
    std::unordered_map<int32_t, int> ahead;  // the drafts before this row, as outputs
    for (int i = 0; i < j; ++i) ++ahead[s.drafts[i]];
    auto penalize = [&](int32_t id, int output) {
      SampleEdit* e = edit(id);
      if (!e) return;
      if (p.repetition_penalty != 1.0f) e->flags |= SampleEdit::kRepeat;
      if (output > 0) {
        e->flags |= SampleEdit::kOutput;
        e->frequency = p.frequency_penalty * static_cast<float>(output);
        e->presence = p.presence_penalty;
      }
    };
    s.counts.each([&](int32_t id, bool, int output) {
      auto it = ahead.find(id);
      if (it != ahead.end()) {
        output += it->second;
        ahead.erase(it);
      }
      penalize(id, output);
    });
    for (const auto& [id, output] : ahead) penalize(id, output);
  }
  SampleRow& row = sample_rows_[k];
  row = SampleRow{};
  row.temperature = p.temperature;
  row.top_p = p.top_p;
  row.min_p = p.min_p;
  row.repetition_penalty = p.repetition_penalty;
  row.top_k = p.top_k;
  row.logprobs = req.logprobs;
  row.seed = req.seed + static_cast<uint64_t>(s.index);  // as the host Sampler is seeded
  row.counter = static_cast<uint64_t>(generated);
  row.edits = edits.data();
  row.n_edits = static_cast<int>(edits.size());
  if (!s.constraints.empty()) {
    std::vector<uint32_t>& mask = sample_masks_[k];
    mask.assign(static_cast<size_t>(vocab + 31) / 32, ~0u);
    for (const auto& c : s.constraints) c->fill_bitmask(mask.data(), vocab);
    row.mask = mask.data();
  }
}

// The host path: the processors, then the Sampler, over the step's row (in place).
int32_t Engine::sample_host(Seq& s, float* logits, TokenLogprob* logprob, const int32_t* draft,
                            bool* accepted) {
  const GenerationRequest& req = s.state->request;
  const int vocab = model_.info().vocab_size;
  // Logprobs are the model's own (before the processors): keep the raw row if they will
  // change it.
  const bool processed = s.generated < req.min_tokens || !req.sampling.logit_bias.empty() ||
                         req.sampling.has_penalties() || !s.constraints.empty();
  if (logprob && processed) raw_logits_.assign(logits, logits + vocab);
  process_logits(s, logits);
  int32_t token;
  if (draft) {
    const DraftVerdict v = s.sampler.verify(logits, vocab, req.sampling, *draft);
    token = v.token;
    *accepted = v.accepted;
  } else {
    token = s.sampler.sample(logits, vocab, req.sampling);
  }
  if (logprob) {
    const LogSoftmax lsm(processed ? raw_logits_.data() : logits, vocab);
    *logprob = {token, lsm.logprob(token), lsm.top(req.logprobs)};
  }
  return token;
}

// The logits processors of the request (sampling.h: min_tokens, logit_bias, penalties;
// then the constraints), in place on the step's row.
void Engine::process_logits(Seq& s, float* logits) {
  const GenerationRequest& req = s.state->request;
  const int vocab = model_.info().vocab_size;
  if (s.generated < req.min_tokens) {
    constexpr float kMasked = -std::numeric_limits<float>::infinity();
    if (!req.ignore_eos)
      for (int32_t id : eos_ids_)
        if (id >= 0 && id < vocab) logits[id] = kMasked;
    for (int32_t id : req.stop_token_ids)
      if (id >= 0 && id < vocab) logits[id] = kMasked;
  }
  if (!req.sampling.logit_bias.empty()) apply_logit_bias(logits, vocab, req.sampling);
  if (req.sampling.has_penalties()) s.counts.apply(logits, vocab, req.sampling);
  for (const auto& c : s.constraints) c->apply(logits, vocab);
}

}  // namespace ninfer
