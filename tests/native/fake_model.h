// A fake paged model for runtime tests (tests/native/test_engine.cpp, the fake server).
//
// It keeps a real paged pool: each row stores its token at its position in its slot's
// blocks, and a row's logits are a hash of the tokens at positions 0..pos read back
// through the block table. So a request's output is right only if the engine fed the
// right tokens at the right positions into blocks nobody else writes, whatever the batch,
// chunking, preemptions or shared prompt blocks did. Every step checks the StepBatch
// contract of model.h (a block in several slots' tables is never written).
//
// Nothing here sleeps or reads the wall clock: a step's cost is modelled (set_cost) and
// advances a FakeClock that the engine under test measures with, and a StepGate decides
// when steps may run, so a test says exactly how far each request gets before it acts.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "check.h"
#include "engine/clock.h"
#include "model/model.h"
#include "text/tokenizer.h"

namespace ninfer::fake {

constexpr int kVocab = 27;  // 'a'..'z' and an end-of-sequence token
constexpr int32_t kEos = 26;

// A Clock that moves only when told: the fake model advances it by each step's cost.
class FakeClock : public Clock {
 public:
  double now_ms() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return ms_;
  }
  void advance(double ms) {
    std::lock_guard<std::mutex> lock(mu_);
    ms_ += ms;
  }

 private:
  mutable std::mutex mu_;
  double ms_ = 0;
};

// Decides when the fake model's steps run: pass() is called at the start of every step.
class StepGate {
 public:
  virtual ~StepGate() = default;
  virtual void pass() = 0;
};

// A step passes with a permit (allow) or freely once open(); otherwise it waits.
class Gate : public StepGate {
 public:
  void pass() override {
    std::unique_lock<std::mutex> lock(mu_);
    ++waiting_;
    cv_.notify_all();
    cv_.wait(lock, [&] { return open_ || permits_ > 0; });
    --waiting_;
    if (!open_) --permits_;
    cv_.notify_all();
  }
  void allow(int steps) {
    std::lock_guard<std::mutex> lock(mu_);
    permits_ += steps;
    cv_.notify_all();
  }
  void open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  void close() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = false;
    permits_ = 0;
  }
  // Waits until a step is held at the gate with no permit left. The engine is then
  // inside Model::step, having done everything the earlier steps lead to (events sent,
  // requests reaped and admitted). The timeout only guards against a hang.
  void wait_held() {
    std::unique_lock<std::mutex> lock(mu_);
    const bool held = cv_.wait_for(lock, std::chrono::seconds(60),
                                   [&] { return waiting_ > 0 && permits_ == 0 && !open_; });
    CHECK(held);
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int permits_ = 0, waiting_ = 0;
  bool open_ = false;
};

class FakeModel : public Model {
 public:
  FakeModel(int max_concurrency, int prefill_chunk, int kv_blocks, int block_size,
            int max_context) {
    info_.model_id = "fake";
    info_.vocab_size = kVocab;
    info_.max_context = max_context;
    info_.prefill_chunk = prefill_chunk;
    info_.num_layers = 1;
    info_.max_concurrency = max_concurrency;
    info_.kv_block_size = block_size;
    info_.kv_blocks = kv_blocks;
    info_.blocks_per_seq = max_context / block_size;
    pool_.assign(static_cast<size_t>(kv_blocks) * block_size, {-1, -1});
  }
  const ModelInfo& info() const override { return info_; }
  // Compiled for n-gram speculation with up to `max_draft_tokens` drafts per sequence.
  void set_spec(int max_draft_tokens) {
    info_.spec = "ngram";
    info_.max_draft_tokens = max_draft_tokens;
    info_.max_logit_rows =
        std::min(info_.prefill_chunk, info_.max_concurrency * (1 + max_draft_tokens));
  }

  // Compiled with an MTP head (--spec mtp) drafting up to `max_draft_tokens`: draft() keeps
  // the head's own key/value cells (the token after each position, as the real head's
  // rows pair a position's hidden state with the next token) and checks, before each
  // chain, that the head holds every position of the sequence up to the chain's row with
  // the sequence's true next token; the drafts are `drafts(tokens, count)`, given the
  // sequence's tokens through the chain's first next token.
  using MtpDrafts = std::function<std::vector<int32_t>(const std::vector<int32_t>&, int)>;
  void set_mtp(int max_draft_tokens, MtpDrafts drafts) {
    set_spec(max_draft_tokens);
    info_.spec = "mtp";
    mtp_drafts_ = std::move(drafts);
    head_.assign(pool_.size(), {-1, -1});
  }

  void draft(const DraftBatch& d, int32_t* out) override {
    CHECK(mtp_drafts_ != nullptr);
    if (fail_draft_at_ >= 0 && drafts_.load() >= fail_draft_at_)
      throw std::runtime_error("draft head lost");
    drafts_.fetch_add(1);
    const ModelInfo& i = info_;
    StepBatch b = last_;  // the last step's rows, read through the draft's block tables
    b.block_tables = d.block_tables;
    for (int r = 0; r < b.n; ++r) {
      if (d.next[r] < 0) continue;
      CHECK(d.next[r] >= 0 && d.next[r] < kVocab);
      head(b, b.slots[r], b.positions[r]) = {d.next[r], b.positions[r]};
    }
    for (int j = 0; j < d.n_seqs; ++j) {
      const int r = d.rows[j], n = d.counts[j];
      CHECK(r >= 0 && r < b.n && d.next[r] >= 0 && n >= 1 && n <= i.max_draft_tokens);
      CHECK(r + 1 == b.n || b.slots[r + 1] != b.slots[r] || d.next[r + 1] < 0);  // its last row
      const int slot = b.slots[r], last = b.positions[r];
      std::vector<int32_t> seq;
      for (int p = 0; p <= last; ++p) {
        CHECK(cell(b, slot, p).pos == p);
        seq.push_back(cell(b, slot, p).token);
      }
      seq.push_back(d.next[r]);
      for (int p = 0; p <= last; ++p) {  // the head saw every position with its next token
        const Cell& h = head(b, slot, p);
        if (h.pos != p || h.token != seq[p + 1])
          fail("MTP head: position " + std::to_string(p) + " of slot " + std::to_string(slot) +
               " holds token " + std::to_string(h.token) + " of position " + std::to_string(h.pos) +
               ", the sequence's next token is " + std::to_string(seq[p + 1]));
      }
      std::vector<int32_t> chain = mtp_drafts_(seq, n);
      chain.resize(static_cast<size_t>(n), 0);
      for (int k = 0; k < n; ++k) {
        CHECK(chain[k] >= 0 && chain[k] < kVocab);
        out[j * i.max_draft_tokens + k] = chain[k];
        // the chain's own rows write the head's cells after `last` (in blocks it holds)
        if (k + 1 < n) head(b, slot, last + 1 + k) = {chain[k], last + 1 + k};
      }
      chained_ += n;
    }
  }

  // A model with recurrent state (a hybrid's Gated DeltaNet layers), after set_spec: each
  // state slot holds a hash of the tokens its sequence fed so far, updated in place by the
  // rows that name it (StepBatch::state_slots) and copied into save slots. Every row checks
  // that its state is exactly that of the tokens at positions 0..pos - 1 the KV pool holds
  // (so a draft's trace left in the state, or a wrong slot made current, fails).
  // `checkpoints`: the prefix cache's state checkpoint slots after the sequences' ones,
  // which copy_state() fills and reads (a checkpoint restored into a sequence whose KV
  // blocks hold other tokens, or at another position, fails the next row's check).
  void set_recurrent(int checkpoints = 0) {
    info_.state_slots = info_.max_concurrency * (1 + info_.max_draft_tokens);
    info_.state_checkpoints = checkpoints;
    state_.assign(info_.state_slots + checkpoints, {0, -1});
  }
  // Rows in multiples of `align` at the prompt's cuts (ModelInfo::prefill_align).
  void set_prefill_align(int align) { info_.prefill_align = align; }

  void copy_state(int from, int to) override {
    const int n = static_cast<int>(state_.size());
    CHECK(from >= 0 && from < n && to >= 0 && to < n && from != to);
    CHECK(state_[from].next >= 0);  // a state that was written
    state_[to] = state_[from];
    copies_.fetch_add(1);
  }

  void step(const StepBatch& b, float* logits) override {
    if (gate_) gate_->pass();
    if (fail_at_step_ >= 0 && steps_.load() >= fail_at_step_)
      throw std::runtime_error("device lost");
    const ModelInfo& i = info_;
    CHECK(b.n >= 1 && b.n <= i.prefill_chunk);
    CHECK(b.n_logits >= 0 && b.n_logits <= i.logit_rows());
    // A slot lists a block once; a block may be in several slots' tables (shared: a
    // request's choices share their prompt's blocks), but then no row writes into it.
    std::map<int32_t, int> holders;
    for (int s = 0; s < i.max_concurrency; ++s) {
      std::set<int32_t> mine;
      for (int j = 0; j < i.blocks_per_seq; ++j) {
        const int32_t blk = b.block_tables[s * i.blocks_per_seq + j];
        CHECK(blk >= 0 && blk < i.kv_blocks);
        if (blk != 0) {
          CHECK(mine.insert(blk).second);
          ++holders[blk];
        }
      }
    }
    std::set<int> used_slots(b.slots, b.slots + b.n);
    for (int s : used_slots) CHECK(s >= 0 && s < i.max_concurrency);
    // Rows of one sequence contiguous, consecutive positions.
    std::set<int> finished_slots;
    for (int r = 0; r < b.n; ++r) {
      if (r > 0 && b.slots[r] == b.slots[r - 1]) {
        CHECK(b.positions[r] == b.positions[r - 1] + 1);
      } else {
        CHECK(finished_slots.insert(b.slots[r]).second);
      }
      CHECK(b.positions[r] >= 0 && b.positions[r] < i.max_context);
    }
    for (int r = 0; r < b.n; ++r) {
      CHECK(holders[block_of(b, b.slots[r], b.positions[r])] == 1);  // not a shared block
      Cell& c = cell(b, b.slots[r], b.positions[r]);
      c = {b.tokens[r], b.positions[r]};
      ++rows_;
    }
    if (i.state_slots > 0) recurrent_rows(b);
    for (int k = 0; k < b.n_logits; ++k) {
      const int r = b.logit_rows[k];
      CHECK(r >= 0 && r < b.n);
      uint64_t h = kFnvBasis;
      for (int p = 0; p <= b.positions[r]; ++p) {
        const Cell& c = cell(b, b.slots[r], p);
        CHECK(c.pos == p);  // written by this sequence at this position
        h = fold(h, c.token);
      }
      float* out = logits + static_cast<size_t>(k) * kVocab;
      std::mt19937_64 g(h);
      for (int v = 0; v < kVocab; ++v) out[v] = static_cast<float>(g() % 1000) / 250.0f;
      out[kEos] -= 1.5f;  // ends now and then, not too soon
    }
    if (mtp_drafts_) {  // draft() reads the step's rows
      last_ = b;
      last_slots_.assign(b.slots, b.slots + b.n);
      last_positions_.assign(b.positions, b.positions + b.n);
      last_.slots = last_slots_.data();
      last_.positions = last_positions_.data();
    }
    steps_.fetch_add(1);
    max_rows_ = std::max(max_rows_.load(), b.n);
    // A step's cost: a base plus each row beyond one per sequence.
    const int extra = b.n - static_cast<int>(used_slots.size());
    const double cost = step_ms_ + extra_row_ms_ * extra;
    if (clock_) clock_->advance(cost);
    std::lock_guard<std::mutex> lock(history_mu_);
    history_.push_back({b.n, static_cast<int>(used_slots.size()), cost});
  }

  // Every step advances `clock` by step_ms plus extra_row_ms per row beyond one per
  // sequence (history() records each step's rows, sequences and cost).
  void set_cost(FakeClock* clock, double step_ms, double extra_row_ms) {
    clock_ = clock;
    step_ms_ = step_ms;
    extra_row_ms_ = extra_row_ms;
  }
  // Every step first passes `gate` (nullptr: steps run freely).
  void set_gate(StepGate* gate) { gate_ = gate; }
  struct StepRows {
    int rows, seqs;
    double cost_ms;
  };
  std::vector<StepRows> history() {
    std::lock_guard<std::mutex> lock(history_mu_);
    return history_;
  }

  std::atomic<int> steps_{0};
  std::atomic<int64_t> rows_{0};  // rows computed, over every step
  std::atomic<int> max_rows_{0};
  int fail_at_step_ = -1;       // >= 0: throw from that step on
  std::atomic<int> drafts_{0};  // draft() calls
  std::atomic<int> copies_{0};  // copy_state() calls
  int64_t chained_ = 0;         // draft tokens made
  int fail_draft_at_ = -1;      // >= 0: draft() throws from that call on

 protected:
  struct Cell {
    int32_t token, pos;
  };
  static constexpr uint64_t kFnvBasis = 1469598103934665603ull;
  static uint64_t fold(uint64_t h, int32_t token) {
    return (h ^ static_cast<uint64_t>(token + 1)) * 1099511628211ull;
  }
  struct State {
    uint64_t hash;
    int next;  // the position it expects (-1: never written)
  };
  // The rows through their state slots, in order (the KV pool holds this step's tokens).
  void recurrent_rows(const StepBatch& b) {
    const int group = info_.state_group();
    CHECK(b.state_slots != nullptr && b.save_slots != nullptr);
    std::map<int, int> owner;  // state slot -> the sequence slot whose rows update it
    for (int r = 0; r < b.n; ++r) {
      const int st = b.state_slots[r];
      CHECK(st >= b.slots[r] * group && st < (b.slots[r] + 1) * group);  // its slot's group
      CHECK(owner.emplace(st, b.slots[r]).first->second == b.slots[r]);
    }
    for (int r = 0; r < b.n; ++r) {
      const int sv = b.save_slots[r];
      if (sv < 0) continue;
      CHECK(sv >= b.slots[r] * group && sv < (b.slots[r] + 1) * group);
      CHECK(owner.count(sv) == 0);  // no row of the step updates it
    }
    for (int r = 0; r < b.n; ++r) {
      State& st = state_[b.state_slots[r]];
      const int p = b.positions[r];
      if (p == 0) st = {kFnvBasis, 0};
      CHECK(st.next == p);     // the state holds positions 0..p-1, no more, no less
      uint64_t h = kFnvBasis;  // what they are: the sequence's tokens in the pool
      for (int q = 0; q < p; ++q) h = fold(h, cell(b, b.slots[r], q).token);
      CHECK(st.hash == h);
      st = {fold(st.hash, b.tokens[r]), p + 1};
      if (b.save_slots[r] >= 0) state_[b.save_slots[r]] = st;
    }
  }
  int32_t block_of(const StepBatch& b, int slot, int pos) const {
    return b.block_tables[slot * info_.blocks_per_seq + pos / info_.kv_block_size];
  }
  // The MTP head's cell of `slot` at `pos` (the same blocks as the model's).
  Cell& head(const StepBatch& b, int slot, int pos) {
    const int32_t blk = block_of(b, slot, pos);
    CHECK(blk >= 1 && blk < info_.kv_blocks);
    return head_[static_cast<size_t>(blk) * info_.kv_block_size + pos % info_.kv_block_size];
  }
  // The token that `slot` stored at `pos` (read back through the block table).
  Cell& cell(const StepBatch& b, int slot, int pos) {
    const int32_t blk = block_of(b, slot, pos);
    CHECK(blk >= 1 && blk < info_.kv_blocks);
    return pool_[static_cast<size_t>(blk) * info_.kv_block_size + pos % info_.kv_block_size];
  }

 private:
  ModelInfo info_;
  FakeClock* clock_ = nullptr;
  double step_ms_ = 0, extra_row_ms_ = 0;
  StepGate* gate_ = nullptr;
  std::mutex history_mu_;
  std::vector<StepRows> history_;
  std::vector<Cell> pool_;
  std::vector<State> state_;  // set_recurrent()
  MtpDrafts mtp_drafts_;      // set_mtp()
  std::vector<Cell> head_;
  StepBatch last_;
  std::vector<int32_t> last_slots_, last_positions_;
};

// tokenizer.json of the fake vocabulary: one token per letter, <eos> special.
inline nlohmann::json letters_tokenizer_json() {
  nlohmann::json vocab = nlohmann::json::object();
  for (int i = 0; i < 26; ++i) vocab[std::string(1, static_cast<char>('a' + i))] = i;
  return {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}},
          {"added_tokens",
           nlohmann::json::array({{{"id", kEos}, {"content", "<eos>"}, {"special", true}}})}};
}

}  // namespace ninfer::fake
