#include "engine/scheduler.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace ninfer {

Scheduler::Scheduler(const SchedulerConfig& config)
    : config_(config), kv_(config.kv_blocks, config.block_size),
      slot_used_(std::max(config.max_concurrency, 0), false) {
  // Invariants of a resolved configuration (the user's values were checked, with what to
  // do about them, by server/options.cpp resolve()).
  auto require = [](bool ok, const std::string& what) {
    if (!ok) throw std::logic_error("scheduler config: " + what);
  };
  require(config.max_concurrency >= 1 && config.max_concurrency <= config.table_rows,
          "max concurrency " + std::to_string(config.max_concurrency) + " outside [1, " +
              std::to_string(config.table_rows) + "]");
  require(config.prefill_chunk >= 1, "prefill chunk below 1");
  require(config.blocks_per_seq >= 1, "blocks per sequence below 1");
}

int Scheduler::max_positions() const {
  return std::min(kv_.total(), config_.blocks_per_seq) * config_.block_size;
}

void Scheduler::add(Sequence* seq) {
  if (seq->tokens.empty()) throw std::invalid_argument("a sequence needs at least one token");
  seq->order = next_order_++;
  seq->num_computed = 0;
  seq->slot = -1;
  waiting_.push_back(seq);
}

void Scheduler::enqueue_in_order(Sequence* seq) {
  auto it =
      std::lower_bound(waiting_.begin(), waiting_.end(), seq,
                       [](const Sequence* a, const Sequence* b) { return a->order < b->order; });
  waiting_.insert(it, seq);
}

void Scheduler::remove(Sequence* seq) {
  auto w = std::find(waiting_.begin(), waiting_.end(), seq);
  if (w != waiting_.end()) waiting_.erase(w);
  auto r = std::find(running_.begin(), running_.end(), seq);
  if (r != running_.end()) {
    running_.erase(r);
    slot_used_[seq->slot] = false;
  }
  kv_.release(seq->blocks);
  seq->slot = -1;
}

void Scheduler::preempt(Sequence* seq, StepPlan& plan, int& budget) {
  for (auto it = plan.chunks.begin(); it != plan.chunks.end(); ++it) {
    if (it->seq == seq) {
      budget += it->count;
      plan.rows -= it->count;
      plan.chunks.erase(it);
      break;
    }
  }
  running_.erase(std::find(running_.begin(), running_.end(), seq));
  slot_used_[seq->slot] = false;
  seq->slot = -1;
  kv_.release(seq->blocks);
  seq->num_computed = 0;  // recomputed from scratch (prompt + generated) when readmitted
  ++seq->preemptions;
  ++preemptions_;
  enqueue_in_order(seq);
  plan.preempted.push_back(seq);
}

StepPlan Scheduler::plan(int prefill_limit) {
  StepPlan plan;
  int budget = config_.prefill_chunk;
  ++step_;
  auto add_chunk = [&](Sequence* s, int count) {
    const Chunk c{s, s->num_computed, count, count == s->pending()};
    plan.chunks.push_back(c);
    plan.rows += count;
    budget -= count;
  };
  auto is_running = [&](const Sequence* s) {
    return std::find(running_.begin(), running_.end(), s) != running_.end();
  };

  // 1. One decode row per running sequence whose prompt is done, least recently served
  // first. A decode row may need a new block; if the pool is dry, preempt the youngest.
  std::vector<Sequence*> decode;
  for (Sequence* s : running_)
    if (s->pending() == 1) decode.push_back(s);
  std::stable_sort(decode.begin(), decode.end(), [](const Sequence* a, const Sequence* b) {
    return a->last_step != b->last_step ? a->last_step < b->last_step : a->order < b->order;
  });
  for (Sequence* s : decode) {
    if (budget == 0) break;
    if (!is_running(s)) continue;  // preempted for an older sequence's block
    bool self_preempted = false;
    while (!kv_.grow(s->blocks, static_cast<int>(s->tokens.size()))) {
      Sequence* victim = *std::max_element(
          running_.begin(), running_.end(),
          [](const Sequence* a, const Sequence* b) { return a->order < b->order; });
      preempt(victim, plan, budget);
      if (victim == s) {
        self_preempted = true;
        break;
      }
    }
    if (!self_preempted) add_chunk(s, 1);
  }

  // Decode rows keep their pace: prompt rows are capped while anything decodes.
  if (plan.rows > 0 && prefill_limit < budget) budget = std::max(1, prefill_limit);

  // 2. Prompt chunks of running sequences still prefilling, oldest first. Their blocks
  // were allocated at admission.
  std::vector<Sequence*> prefill;
  for (Sequence* s : running_)
    if (s->pending() > 1) prefill.push_back(s);
  std::sort(prefill.begin(), prefill.end(),
            [](const Sequence* a, const Sequence* b) { return a->order < b->order; });
  for (Sequence* s : prefill) {
    if (budget == 0) break;
    if (!kv_.grow(s->blocks, static_cast<int>(s->tokens.size())))
      throw std::logic_error("a prefilling sequence lacks the blocks reserved at admission");
    add_chunk(s, std::min(s->pending(), budget));
  }

  // 3. Admission, strictly in order (the head is never overtaken, so it cannot starve),
  // and not in a step that had to preempt (the pool is full).
  while (budget > 0 && plan.preempted.empty() && free_slots() > 0 && !waiting_.empty()) {
    Sequence* s = waiting_.front();
    const int need = kv_.blocks_for(static_cast<int>(s->tokens.size()));
    // Blocks the running sequences need for their next token: admitting into those
    // would only force a preemption in the next step.
    int spare = 0;
    for (const Sequence* r : running_)
      spare += std::max(0, kv_.blocks_for(static_cast<int>(r->tokens.size()) + 1) -
                               static_cast<int>(r->blocks.size()));
    if (!running_.empty() && need + spare > kv_.free()) break;
    if (!kv_.grow(s->blocks, static_cast<int>(s->tokens.size()))) break;
    waiting_.pop_front();
    const int slot = static_cast<int>(std::find(slot_used_.begin(), slot_used_.end(), false) -
                                      slot_used_.begin());
    slot_used_[slot] = true;
    s->slot = slot;
    s->num_computed = 0;
    running_.push_back(s);
    plan.admitted.push_back(s);
    add_chunk(s, std::min(s->pending(), budget));
  }
  return plan;
}

void Scheduler::commit(const StepPlan& plan) {
  for (const Chunk& c : plan.chunks) {
    c.seq->num_computed += c.count;
    c.seq->last_step = step_;
  }
}

void Scheduler::fill_block_tables(int32_t* tables) const {
  std::vector<const std::vector<int32_t>*> by_slot(config_.table_rows, nullptr);
  for (const Sequence* s : running_) by_slot[s->slot] = &s->blocks;
  ninfer::fill_block_tables(tables, config_.table_rows, config_.blocks_per_seq, by_slot);
}

}  // namespace ninfer
