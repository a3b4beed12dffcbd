#include "engine/scheduler.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>

namespace ninfer {

Scheduler::Scheduler(const SchedulerConfig& config)
    : config_(config), kv_(config.kv_blocks, config.block_size),
      slot_used_(std::max(config.max_concurrency, 0), false),
      hasher_(config.block_size, config.hash_extra) {
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
  require(config.prefill_align >= 1 &&
              (config.prefill_align == 1 ||
               config.prefill_chunk - config.max_concurrency + 1 >= config.prefill_align),
          "prefill alignment " + std::to_string(config.prefill_align) + " does not fit a step of " +
              std::to_string(config.prefill_chunk) + " rows with " +
              std::to_string(config.max_concurrency - 1) + " decode rows");
  require(config.hash_extra >= 0 && config.state_align >= 1 && config.state_checkpoints >= 0 &&
              config.checkpoint_interval >= 0,
          "negative prefix-cache setting");
  kv_.set_caching(config.prefix_caching);
  if (config.recurrent) {
    granularity_ = std::lcm(config.block_size, config.state_align);
    require(config.checkpoint_interval % granularity_ == 0,
            "state checkpoint interval " + std::to_string(config.checkpoint_interval) +
                " is not a multiple of " + std::to_string(granularity_));
    checkpoints_.resize(config.prefix_caching ? config.state_checkpoints : 0);
  }
}

int Scheduler::checkpoints_used() const {
  int n = 0;
  for (const Checkpoint& c : checkpoints_) n += c.hash != 0 ? 1 : 0;
  return n;
}

void Scheduler::publish_running() {
  for (Sequence* s : running_) publish(s, true);
}

void Scheduler::publish(Sequence* s, bool deferred) {
  if (!kv_.caching() || s->shares || s->slot < 0 || (config_.hash_extra > 0 && !deferred)) return;
  const int bs = config_.block_size;
  int limit = s->num_computed - config_.hash_extra;
  if (config_.recurrent) limit = std::min(limit, s->cacheable);
  hasher_.extend(s->hashes, s->tokens.data(), static_cast<int>(s->tokens.size()));
  const int n = std::min(
      {limit / bs, static_cast<int>(s->hashes.size()), static_cast<int>(s->blocks.size())});
  for (int i = s->published; i < n; ++i)
    kv_.publish(s->blocks[i], s->hashes[i], i > 0 ? s->hashes[i - 1] : 0,
                s->tokens.data() + static_cast<size_t>(i) * bs, hasher_.span());
  s->published = std::max(s->published, n);
}

std::vector<int32_t> Scheduler::cached_prefix(Sequence* s, int* checkpoint) {
  *checkpoint = -1;
  if (!kv_.caching()) return {};
  const int n = static_cast<int>(s->tokens.size());
  hasher_.extend(s->hashes, s->tokens.data(), n);
  // At least the last token is computed: its logits are what the step is for.
  std::vector<int32_t> hit =
      kv_.match(s->hashes, s->tokens.data(), n, (n - 1) / config_.block_size);
  if (config_.recurrent) {
    size_t keep = 0;
    for (size_t i = hit.size(); i >= 1 && keep == 0; --i) {
      if ((static_cast<int>(i) * config_.block_size) % granularity_ != 0) continue;
      auto it = checkpoint_of_.find(s->hashes[i - 1]);
      if (it == checkpoint_of_.end()) continue;
      keep = i;
      *checkpoint = it->second;
    }
    hit.resize(keep);
  }
  return hit;
}

int Scheduler::next_checkpoint(const Sequence& s) const {
  if (checkpoints_.empty()) return 0;
  const int end = (static_cast<int>(s.tokens.size()) - 1) / granularity_ * granularity_;
  const int every = config_.checkpoint_interval;
  for (int b = s.num_computed;;) {
    int next = end;  // the last checkpoint position of the prompt, or an earlier interval's
    if (every > 0) next = std::min(end, (b / every + 1) * every);
    if (next <= b) return 0;
    const size_t i = static_cast<size_t>(next / config_.block_size) - 1;
    if (i >= s.hashes.size()) return 0;
    if (!checkpoint_of_.count(s.hashes[i])) return next;  // not checkpointed yet
    b = next;
  }
}

int Scheduler::take_checkpoint() {
  int best = -1;
  for (int c = 0; c < static_cast<int>(checkpoints_.size()); ++c) {
    const Checkpoint& k = checkpoints_[c];
    if (k.writing >= 0) continue;
    if (k.hash == 0) {
      best = c;
      break;
    }
    if (best < 0 || k.last_use < checkpoints_[best].last_use) best = c;
  }
  if (best < 0) return -1;
  Checkpoint& k = checkpoints_[best];
  if (k.hash != 0) checkpoint_of_.erase(k.hash);
  k.hash = 0;
  k.writing = step_;
  return best;
}

int Scheduler::prompt_rows(const Sequence& s, int budget) const {
  const int pending = s.pending();
  int rows;
  if (pending <= budget || config_.prefill_align == 1) {
    rows = std::min(pending, budget);
  } else {
    const int a = config_.prefill_align;
    const int end = (s.num_computed + budget) / a * a;
    rows = std::max(0, end - s.num_computed);
  }
  const int b = next_checkpoint(s);  // a state checkpoint: the chunk ends there
  return b > 0 ? std::min(rows, b - s.num_computed) : rows;
}

int Scheduler::max_positions() const {
  return std::min(kv_.total(), config_.blocks_per_seq) * config_.block_size;
}

void Scheduler::add(Sequence* seq) {
  if (seq->tokens.empty()) throw std::invalid_argument("a sequence needs at least one token");
  seq->order = next_order_++;
  seq->num_computed = 0;
  seq->slot = -1;
  for (Sequence* f : seq->forks) {
    if (f->tokens != seq->tokens) throw std::invalid_argument("a fork must have the same tokens");
    f->order = next_order_++;
    f->num_computed = 0;
    f->slot = -1;
    f->shares = nullptr;
  }
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
  if (w != waiting_.end()) {
    waiting_.erase(w);
    for (Sequence* f : seq->forks) enqueue_in_order(f);  // on their own now
    seq->forks.clear();
  }
  for (Sequence* leader : waiting_) {  // a fork not admitted yet
    auto f = std::find(leader->forks.begin(), leader->forks.end(), seq);
    if (f != leader->forks.end()) leader->forks.erase(f);
  }
  auto r = std::find(running_.begin(), running_.end(), seq);
  if (r != running_.end()) {
    publish(seq);  // finished or cancelled: its computed blocks stay cached
    seq->published = 0;
    running_.erase(r);
    slot_used_[seq->slot] = false;
    detach_forks(seq, nullptr, nullptr);
  }
  kv_.release(seq->blocks);
  seq->slot = -1;
  seq->shares = nullptr;
}

void Scheduler::requeue(Sequence* seq) {
  publish(seq);  // what it computed stays cached: its readmission may start there
  seq->published = 0;
  running_.erase(std::find(running_.begin(), running_.end(), seq));
  slot_used_[seq->slot] = false;
  seq->slot = -1;
  kv_.release(seq->blocks);
  seq->shares = nullptr;
  seq->num_computed = 0;  // recomputed from scratch (prompt + generated) when readmitted
  enqueue_in_order(seq);
}

void Scheduler::detach_forks(Sequence* seq, StepPlan* plan, int* budget) {
  std::vector<Sequence*> forks;
  for (Sequence* r : running_)
    if (r->shares == seq) forks.push_back(r);
  for (Sequence* f : forks) {
    if (plan) preempt(f, *plan, *budget);
    else requeue(f);
  }
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
  requeue(seq);
  ++seq->preemptions;
  ++preemptions_;
  plan.preempted.push_back(seq);
  detach_forks(seq, &plan, &budget);
}

int Scheduler::take_slot() {
  const int slot =
      static_cast<int>(std::find(slot_used_.begin(), slot_used_.end(), false) - slot_used_.begin());
  slot_used_[slot] = true;
  return slot;
}

StepPlan Scheduler::plan(int prefill_limit) {
  StepPlan plan;
  int budget = config_.prefill_chunk;
  ++step_;
  // Checkpoint slots of an earlier plan whose step never committed (it failed).
  for (Checkpoint& k : checkpoints_)
    if (k.writing >= 0 && k.writing < step_) k.writing = -1;
  auto add_chunk = [&](Sequence* s, int count) {
    Chunk c{s, s->num_computed, count, count == s->pending()};
    if (count > 1 || s->pending() > 1) {  // a prompt chunk: does it end at a checkpoint?
      const int b = next_checkpoint(*s);
      if (b > 0 && s->num_computed + count == b) c.checkpoint = take_checkpoint();
    }
    plan.chunks.push_back(c);
    plan.rows += count;
    budget -= count;
  };
  auto is_running = [&](const Sequence* s) {
    return std::find(running_.begin(), running_.end(), s) != running_.end();
  };

  // 0. Forks whose shared prompt prefix has been computed: the shared blocks go in front
  // of their own, and they continue from there like any prefilling sequence.
  for (Sequence* s : running_) {
    if (!s->shares || s->shares->num_computed < s->share_len) continue;
    std::vector<int32_t> blocks;
    kv_.share(s->shares->blocks, s->share_len / config_.block_size, blocks);
    blocks.insert(blocks.end(), s->blocks.begin(), s->blocks.end());
    s->blocks.swap(blocks);
    s->num_computed = s->share_len;
    s->shares = nullptr;
  }

  // 1. One decode row per running sequence whose prompt is done, least recently served
  // first. A decode row may need a new block; if the pool is dry, preempt the youngest.
  std::vector<Sequence*> decode;
  for (Sequence* s : running_)
    if (s->pending() == 1 && !s->shares) decode.push_back(s);
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

  // 1b. Speculation: the decode rows' drafts, in the same order, as far as the budget and
  // free blocks go. Drafts never preempt, and they leave prompts room to progress: the
  // alignment's rows (at least one) when a prompt is being prefilled or waits, and the
  // waiting head's blocks.
  bool prompts = !waiting_.empty();
  for (const Sequence* s : running_) prompts = prompts || s->pending() > 1 || s->shares;
  int draft_budget = std::max(0, budget - (prompts ? std::max(1, config_.prefill_align) : 0));
  const int keep_free = waiting_head_blocks();
  for (Chunk& c : plan.chunks) {
    Sequence* s = c.seq;
    const int n = static_cast<int>(s->tokens.size());
    int d = std::min(static_cast<int>(s->drafts.size()), draft_budget);
    for (; d > 0; --d) {
      const int extra = kv_.blocks_for(n + d) - static_cast<int>(s->blocks.size());
      if (extra > 0 && kv_.free() - extra < keep_free) continue;
      if (kv_.grow(s->blocks, n + d)) break;
    }
    s->drafts.resize(d);
    c.count += d;
    c.drafts = d;
    plan.rows += d;
    budget -= d;
    draft_budget -= d;
  }

  // Decode rows keep their pace: prompt rows are capped while anything decodes (to no
  // fewer than the alignment, which the oldest prompt needs to progress).
  if (plan.rows > 0 && prefill_limit < budget)
    budget = std::min(budget, std::max({1, prefill_limit, config_.prefill_align}));

  // 2. Prompt chunks of running sequences still prefilling, oldest first. Their blocks
  // were allocated at admission.
  std::vector<Sequence*> prefill;
  for (Sequence* s : running_)
    if (s->pending() > 1 && !s->shares) prefill.push_back(s);
  std::sort(prefill.begin(), prefill.end(),
            [](const Sequence* a, const Sequence* b) { return a->order < b->order; });
  for (Sequence* s : prefill) {
    if (budget == 0) break;
    if (!kv_.grow(s->blocks, static_cast<int>(s->tokens.size())))
      throw std::logic_error("a prefilling sequence lacks the blocks reserved at admission");
    const int rows = prompt_rows(*s, budget);
    if (rows > 0) add_chunk(s, rows);
  }

  // 3. Admission, strictly in order (the head is never overtaken, so it cannot starve),
  // and not in a step that had to preempt (the pool is full).
  while (budget > 0 && plan.preempted.empty() && !waiting_.empty()) {
    Sequence* s = waiting_.front();
    const int group = 1 + static_cast<int>(s->forks.size());
    if (free_slots() < group) break;
    const int n = static_cast<int>(s->tokens.size());
    // The longest cached prefix (and, for a recurrent model, its state checkpoint).
    int checkpoint = -1;
    const std::vector<int32_t> hit = cached_prefix(s, &checkpoint);
    const int hit_blocks = static_cast<int>(hit.size());
    const int hit_len = hit_blocks * config_.block_size;
    s->num_computed = hit_len;
    if (prompt_rows(*s, budget) == 0) {
      s->num_computed = 0;
      break;
    }
    // Each fork shares the blocks before the one holding the prompt's last position and
    // gets blocks of its own for the rest; where the choices do not share their prompt's
    // blocks (recurrent state), each starts from the cached prefix and prefills the rest.
    const bool share = !s->forks.empty() && config_.share_prompt_blocks;
    const int shared_blocks = share ? (n - 1) / config_.block_size : 0;
    const int own = kv_.blocks_for(n) - (share ? shared_blocks : hit_blocks);
    // Cached blocks nobody holds count as free until they are taken.
    const int need = kv_.blocks_for(n) - hit_blocks + kv_.unreferenced(hit) +
                     static_cast<int>(s->forks.size()) * own;
    // Blocks the running sequences need for their next token: admitting into those
    // would only force a preemption in the next step.
    int spare = 0;
    for (const Sequence* r : running_) {
      const int held =
          static_cast<int>(r->blocks.size()) + (r->shares ? r->share_len / config_.block_size : 0);
      spare += std::max(0, kv_.blocks_for(static_cast<int>(r->tokens.size()) + 1) - held);
    }
    if ((!running_.empty() && need + spare > kv_.free()) || need > kv_.free()) {
      s->num_computed = 0;
      break;
    }
    kv_.acquire(hit, s->blocks);
    if (!kv_.grow(s->blocks, n)) throw std::logic_error("an admitted sequence lacks its blocks");
    if (kv_.caching()) {
      prefix_queries_ += static_cast<uint64_t>(n);
      prefix_hits_ += static_cast<uint64_t>(hit_len);
    }
    auto admit = [&](Sequence* q) {
      q->slot = take_slot();
      q->published = 0;
      q->cacheable = n / config_.state_align * config_.state_align;
      if (q->cached_tokens < 0) q->cached_tokens = hit_len;
      if (checkpoint >= 0) {
        plan.restores.push_back({q, checkpoint});
        checkpoints_[checkpoint].last_use = step_;
      }
      running_.push_back(q);
      plan.admitted.push_back(q);
    };
    waiting_.pop_front();
    admit(s);
    add_chunk(s, prompt_rows(*s, budget));
    for (Sequence* f : s->forks) {  // rows from a later step on
      if (share) {
        if (!kv_.grow(f->blocks, own * config_.block_size))
          throw std::logic_error("a fork lacks the blocks counted for it");
        f->num_computed = 0;
        f->share_len = shared_blocks * config_.block_size;
        f->shares = shared_blocks > 0 ? s : nullptr;
      } else {
        kv_.acquire(hit, f->blocks);
        if (!kv_.grow(f->blocks, n))
          throw std::logic_error("a fork lacks the blocks counted for it");
        f->num_computed = hit_len;
        f->shares = nullptr;
        f->hashes = s->hashes;
      }
      admit(f);
    }
    s->forks.clear();
  }
  return plan;
}

void Scheduler::commit(const StepPlan& plan) {
  for (const Chunk& c : plan.chunks) {
    Sequence* s = c.seq;
    s->num_computed += c.count - c.drafts;
    s->last_step = step_;
    if (c.checkpoint >= 0) {  // the engine copied the state after the chunk there
      Checkpoint& k = checkpoints_[c.checkpoint];
      k.writing = -1;
      const size_t i = static_cast<size_t>(s->num_computed / config_.block_size) - 1;
      const uint64_t key = i < s->hashes.size() ? s->hashes[i] : 0;
      if (key != 0 && checkpoint_of_.emplace(key, c.checkpoint).second) {
        k.hash = key;
        k.last_use = step_;
      }
    }
    publish(s);
  }
}

void Scheduler::accept_draft(Sequence* seq) {
  if (seq->num_computed >= static_cast<int>(seq->tokens.size()))
    throw std::logic_error("accept_draft: the accepted draft is not among the tokens");
  ++seq->num_computed;
}

int Scheduler::waiting_head_blocks() const {
  if (waiting_.empty()) return 0;
  const Sequence* head = waiting_.front();
  return kv_.blocks_for(static_cast<int>(head->tokens.size())) *
         (1 + static_cast<int>(head->forks.size()));
}

bool Scheduler::reserve(Sequence* seq, int positions) {
  if (seq->slot < 0 || seq->shares) return false;
  const int want = kv_.blocks_for(positions);
  const int extra = want - static_cast<int>(seq->blocks.size());
  if (extra <= 0) return true;
  if (want > config_.blocks_per_seq || kv_.free() - extra < waiting_head_blocks()) return false;
  return kv_.grow(seq->blocks, positions);
}

void Scheduler::drop_rejected(Sequence* seq) {
  seq->drafts.clear();
  if (seq->slot >= 0) kv_.shrink(seq->blocks, static_cast<int>(seq->tokens.size()));
}

void Scheduler::fill_block_tables(int32_t* tables) const {
  std::vector<const std::vector<int32_t>*> by_slot(config_.table_rows, nullptr);
  for (const Sequence* s : running_)
    if (!s->shares) by_slot[s->slot] = &s->blocks;  // a fork waiting for its prefix: none yet
  ninfer::fill_block_tables(tables, config_.table_rows, config_.blocks_per_seq, by_slot);
}

}  // namespace ninfer
