// The Engine's speculative decoding: the drafts each sequence brings to a plan (prompt
// lookup, or what the MTP head proposed after the last step), their verification
// against the step's logits rows, and the MTP head's pass after a step.
#include <algorithm>
#include <string>
#include <unordered_set>
#include <vector>

#include "engine/engine.h"
#include "engine/engine_seq.h"
#include "observe/metrics.h"

namespace ninfer {

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

void Engine::draft_mtp(const StepPlan& plan) {
  const ModelInfo& info = model_.info();
  std::unordered_set<const Sequence*> alive;  // the plan's sequences may have finished
  for (const auto& p : seqs_) alive.insert(p.get());
  const int limit = std::min(max_context_, max_positions_);
  draft_next_.assign(static_cast<size_t>(plan.rows), -1);
  draft_rows_.clear();
  draft_counts_.clear();
  draft_seqs_.clear();
  int row = 0;
  for (const Chunk& c : plan.chunks) {
    const int first = row;
    row += c.count;
    if (!alive.count(c.seq)) continue;
    Seq& s = static_cast<Seq&>(*c.seq);
    const int size = static_cast<int>(s.tokens.size());
    // A row's next token, where its own token is the sequence's (not a rejected draft).
    for (int i = 0; i < c.count; ++i) {
      const int p = c.start + i;
      if (p + 1 < size && s.tokens[p] == tokens_[first + i])
        draft_next_[first + i] = s.tokens[p + 1];
    }
    auto* held = dynamic_cast<HeldDrafter*>(s.drafter.get());
    const int last = size - 2;  // the row whose next token is the sequence's last
    if (!held || s.slot < 0 || s.shares || s.pending() != 1 || last < c.start ||
        last >= c.start + c.count || draft_next_[first + last - c.start] < 0)
      continue;
    int room = std::min({draft_tokens_, s.max_tokens - s.generated - 1, limit - size});
    // the chain writes the head's keys/values at positions size - 1 .. size + room - 3
    while (room > 0 && !sched_.reserve(&s, size + room - 2)) --room;
    if (room <= 0) continue;
    draft_seqs_.push_back(&s);
    draft_rows_.push_back(first + last - c.start);
    draft_counts_.push_back(room);
  }
  sched_.fill_block_tables(block_tables_.data());
  DraftBatch b;
  b.next = draft_next_.data();
  b.n_seqs = static_cast<int>(draft_seqs_.size());
  b.rows = draft_rows_.data();
  b.counts = draft_counts_.data();
  b.block_tables = block_tables_.data();
  const int k = info.max_draft_tokens;
  draft_out_.assign(draft_seqs_.size() * static_cast<size_t>(k), -1);
  try {
    model_.draft(b, draft_out_.data());
  } catch (const std::exception& e) {
    // The head's keys/values of the step's sequences are incomplete: none can go on.
    const double now = clock_.now_ms();
    std::vector<Seq*> hit;
    for (const Chunk& c : plan.chunks)
      if (alive.count(c.seq)) hit.push_back(static_cast<Seq*>(c.seq));
    for (Seq* s : hit) fail(*s, std::string("MTP draft step failed: ") + e.what(), "", now);
    return;
  }
  for (size_t j = 0; j < draft_seqs_.size(); ++j) {
    const auto* out = draft_out_.data() + j * static_cast<size_t>(k);
    static_cast<HeldDrafter&>(*draft_seqs_[j]->drafter)
        .hold(std::vector<int32_t>(out, out + draft_counts_[j]));
  }
}

}  // namespace ninfer
