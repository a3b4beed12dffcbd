// Continuous-batching policy, free of threads, models and I/O so it can be tested alone.
//
// Sequences wait (arrival order) or run (each holding a slot and KV blocks). Every step
// is planned under a token budget: first one decode row for each running sequence that
// has all but its last token computed (least recently served first, so a budget smaller
// than the running set still serves everyone in turn), then prompt chunks of running
// sequences still prefilling (oldest first; a long prompt spreads over several steps),
// then newly admitted sequences. A sequence is admitted when a slot is free and the
// blocks for its whole prompt are free (besides the blocks the running sequences need for
// their next token, so that admitting does not force a preemption at once). Decode blocks
// are allocated lazily, one per `block_size` tokens; when the pool runs dry the youngest
// running sequence is preempted: its blocks are freed and it goes back to the head of the
// queue with its tokens, to be recomputed (prompt + generated so far) when readmitted.
// The oldest sequence is never preempted while others run, so it always progresses.
//
// A request with n > 1 choices is one sequence with n - 1 `forks`: the group is admitted
// at once (n slots, and blocks for the prompt plus each fork's own tail). The prompt is
// prefilled once, by the first sequence; its blocks that hold only positions before the
// prompt's last token are then shared (reference counts in KvBlocks) with every fork, and
// each fork recomputes only the rest of the prompt (1 to block_size tokens, into blocks of
// its own) to get its own first logits. No sequence ever gets rows in a block it shares.
// A fork that is preempted, or whose first sequence goes away before the prefix is
// computed, becomes a sequence of its own (recomputed from scratch when readmitted).
#pragma once

#include <cstdint>
#include <deque>
#include <limits>
#include <vector>

#include "engine/kv_blocks.h"

namespace ninfer {

struct Sequence {
  uint64_t order = 0;           // arrival order, set by Scheduler::add; smaller = older
  std::vector<int32_t> tokens;  // prompt, then every sampled token fed back
  int num_computed = 0;         // tokens whose keys/values are in the pool
  int slot = -1;                // -1 while waiting
  std::vector<int32_t> blocks;  // KV blocks, position p lives in blocks[p / block_size]
  int64_t last_step = -1;       // last step that gave it rows
  int preemptions = 0;
  // n > 1, while waiting: the request's other choices, admitted together with this one.
  std::vector<Sequence*> forks;
  // A fork while the sequence it shares the prompt prefix with has not computed it yet:
  // it gets no rows, and `blocks` holds only its own blocks (for positions share_len..).
  Sequence* shares = nullptr;
  int share_len = 0;
  // Speculative decoding: tokens proposed for the positions after `tokens` (set by the
  // engine before plan(); a decode row brings as many of them as the step has room and KV
  // blocks for, and plan() cuts this to those). They are not part of `tokens` until the
  // model's verification accepts them.
  std::vector<int32_t> drafts;
  // Models with recurrent state: which state slot of its slot's group holds the sequence's
  // state (ModelInfo::state_slots; the engine moves it to the accepted draft's).
  int state_index = 0;
  int pending() const { return static_cast<int>(tokens.size()) - num_computed; }
};

// Rows tokens[start, start+count) of `seq` at positions start.., in slot seq->slot. A
// decode chunk with drafts: its last `drafts` rows are seq->drafts (positions
// tokens.size()..), and every row of it returns logits (the verification).
struct Chunk {
  Sequence* seq = nullptr;
  int start = 0;
  int count = 0;
  bool logits = false;  // the chunk ends at the sequence's last token: sample after it
  int drafts = 0;
};

struct StepPlan {
  std::vector<Chunk> chunks;  // one per sequence; decode rows first
  int rows = 0;
  std::vector<Sequence*> admitted;   // waiting -> running in this plan
  std::vector<Sequence*> preempted;  // running -> waiting (blocks freed) in this plan
};

struct SchedulerConfig {
  int max_concurrency = 1;  // slots in use at once (<= compiled)
  int table_rows = 1;       // block-table rows: the compiled max_concurrency
  int prefill_chunk = 1;    // rows per step (<= compiled prefill_chunk)
  int kv_blocks = 2;        // pool size, block 0 reserved
  int block_size = 1;
  int blocks_per_seq = 1;  // block-table width
  // n > 1: the choices share the prompt's KV blocks (one prefill). Off for models with
  // recurrent state (ModelInfo::state_slots), whose choices each prefill their prompt.
  bool share_prompt_blocks = true;
  // > 1: a prompt chunk that is not the prompt's last ends at a position that is a
  // multiple of this (ModelInfo::prefill_align: the Gated DeltaNet kernels' chunk, whose
  // results depend on where a prompt's steps end), and a step that also decodes still
  // gives prompts this many rows. Needs prefill_chunk - max_concurrency + 1 >= it, so the
  // oldest prefilling sequence always reaches its next multiple.
  int prefill_align = 1;
};

class Scheduler {
 public:
  explicit Scheduler(const SchedulerConfig& config);

  // Queues a new sequence (tokens = its prompt, non-empty) and its forks (same tokens).
  void add(Sequence* seq);
  // Drops a sequence wherever it is, freeing its slot and blocks.
  void remove(Sequence* seq);
  // Plans the next step; may admit and preempt. Empty when there is nothing to run.
  // `prefill_limit` caps the prompt rows of a step that also has decode rows (at least
  // one prompt row still goes in, so prefill always progresses).
  StepPlan plan(int prefill_limit = std::numeric_limits<int>::max());
  // Records that the planned rows were computed (call after the model step). Draft rows
  // are not counted: the engine counts the accepted ones (accept_draft) and then calls
  // drop_rejected.
  void commit(const StepPlan& plan);
  // A draft of `seq`'s last step was accepted: it is now seq->tokens' next token, and
  // its key/value (computed in that step) is kept.
  void accept_draft(Sequence* seq);
  // Releases the KV blocks past those seq->tokens needs (rejected drafts' rows) and
  // clears seq->drafts.
  void drop_rejected(Sequence* seq);
  // Grows a running sequence's blocks to cover `positions` (speculation's lookahead: the
  // MTP head's chained draft rows write keys/values past its tokens), as drafts get
  // blocks: never preempting, never taking the waiting head's. False when they are not
  // free (the blocks are then unchanged); true when already held.
  bool reserve(Sequence* seq, int positions);
  // [table_rows x blocks_per_seq] block ids of the running sequences, by slot.
  void fill_block_tables(int32_t* tables) const;

  const std::deque<Sequence*>& waiting() const { return waiting_; }
  const std::vector<Sequence*>& running() const { return running_; }
  const KvBlocks& kv() const { return kv_; }
  const SchedulerConfig& config() const { return config_; }
  int free_slots() const { return config_.max_concurrency - static_cast<int>(running_.size()); }
  uint64_t preemptions() const { return preemptions_; }
  // Most positions one sequence can ever hold: the pool and the block-table width.
  int max_positions() const;

 private:
  void preempt(Sequence* seq, StepPlan& plan, int& budget);
  // running -> waiting: slot and blocks freed, to be recomputed from scratch.
  void requeue(Sequence* seq);
  // Forks still waiting for `seq`'s prompt prefix become sequences of their own.
  void detach_forks(Sequence* seq, StepPlan* plan, int* budget);
  void enqueue_in_order(Sequence* seq);
  int take_slot();
  int waiting_head_blocks() const;  // the blocks the waiting head needs to be admitted
  // Rows of `s`'s prompt for a step with `budget` rows left: all it has pending if they
  // fit, else up to the last multiple of the alignment within the budget (0: none).
  int prompt_rows(const Sequence& s, int budget) const;

  SchedulerConfig config_;
  KvBlocks kv_;
  std::deque<Sequence*> waiting_;
  std::vector<Sequence*> running_;  // admission order
  std::vector<bool> slot_used_;
  uint64_t next_order_ = 0;
  int64_t step_ = 0;
  uint64_t preemptions_ = 0;
};

}  // namespace ninfer
