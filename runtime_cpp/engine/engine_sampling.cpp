// The Engine's sampling of a step's rows: the request's logits processors and Sampler on
// the host, or the same as parameters of the device sampler's row.
#include <algorithm>
#include <limits>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/engine.h"
#include "engine/engine_seq.h"
#include "observe/metrics.h"

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

// Each decoding sequence's drafts for the next plan: prompt lookup over its tokens, as
// many as the request can still use (its max_tokens, the context and the block table).
void Engine::propose_drafts() {
  const int limit = std::min(max_context_, max_positions_);
  for (auto& p : seqs_) {
    Seq& s = *p;
    s.drafts.clear();
    if (!s.drafter || s.slot < 0 || s.shares || s.pending() != 1) continue;
    // On the device a draft row's mask would need the constraint advanced over the drafts
    // before it: constrained requests decode without drafts there.
    if (model_.samples_on_device() && !s.constraints.empty()) continue;
    const int room = std::min(
        {draft_tokens_, s.max_tokens - s.generated - 1, limit - static_cast<int>(s.tokens.size())});
    if (room <= 0) continue;
    s.drafts = s.drafter->propose(room);
    if (static_cast<int>(s.drafts.size()) > room) s.drafts.resize(room);  // a drafter's excess
    for (int32_t& t : s.drafts)  // an id the model cannot take is no draft: cut there
      if (t < 0 || t >= model_.info().vocab_size) {
        s.drafts.resize(&t - s.drafts.data());
        break;
      }
  }
}

// Logits row first + j follows s's token j - 1 of the step (j = 0: its last real token):
// row j decides draft j (j < drafts), the last row gives the token after all of them.
// Each row goes through the request's processors with the counts and constraint state of
// the tokens accepted before it, as a step without speculation would have done.
bool Engine::verify_drafts(Seq& s, int first, double now, const std::vector<std::string>* errors) {
  const GenerationRequest& req = s.state->request;
  const int vocab = model_.info().vocab_size;
  const std::vector<int32_t> drafts = s.drafts;
  const int d = static_cast<int>(drafts.size());
  int accepted = 0;
  if (metrics_ && d > 0) metrics_->observe_proposal();
  for (int j = 0; j <= d; ++j) {
    if (j > 0)  // the step's prepare() covered the first row
      for (const auto& c : s.constraints) c->prepare();
    TokenLogprob lp;
    TokenLogprob* want = req.logprobs >= 0 ? &lp : nullptr;
    bool ok = false;  // draft j accepted (never for the last row, which has no draft)
    int32_t token;
    if (errors) {  // sampled on the device, each row with its own counter: compare
      if (!(*errors)[first + j].empty()) throw std::runtime_error((*errors)[first + j]);
      SampledToken& t = sampled_[first + j];
      if (t.token < 0) throw std::runtime_error(kAllMaskedError);
      token = t.token;
      ok = j < d && token == drafts[j];
      if (want) *want = {token, t.logprob, std::move(t.top)};
    } else {
      token = sample_host(s, logits_.data() + static_cast<size_t>(first + j) * vocab, want,
                          j < d ? &drafts[j] : nullptr, &ok);
    }
    if (j < d) {  // decided (the drafts after a finishing token are not)
      ++s.draft_n;
      if (metrics_) metrics_->observe_draft(j, ok);
    }
    if (ok) {
      ++accepted;
      ++s.draft_accepted_n;
    }
    if (on_token(s, token, want, now, /*first_in_step=*/j == 0)) return true;  // s is gone
    if (!ok) break;
    sched_.accept_draft(&s);
  }
  sched_.drop_rejected(&s);
  // The recurrent state after the last accepted row was saved in the group's slot after
  // the current one by 1 + accepted (run_step); after every draft it is the current one.
  if (const int group = model_.info().state_group(); group > 0 && accepted < d)
    s.state_index = (s.state_index + 1 + accepted) % group;
  return false;
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
