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
//
// Prefix caching (SchedulerConfig::prefix_caching, kv_blocks.h): every full block a
// sequence has computed is published under its content hash (in commit(), and when the
// sequence leaves or is preempted), so it outlives the sequence until the pool needs it.
// A sequence being admitted (new, or readmitted after a preemption) takes the longest
// chain of cached blocks that leaves at least its last token to compute and starts from
// there (Sequence::cached_tokens). Draft rows are never published: only positions the
// verification accepted (num_computed) count.
//
// Models with recurrent state need the state at the hit's boundary too: a hit ends where a
// state checkpoint holds the state after exactly that prefix. Checkpoints are taken at
// positions that are multiples of both the block size and the prefill alignment (so the
// prompt chunk that ends there is one the kernels may end at anyway, and the state bits
// are every schedule's): the last such position before the end of each prompt, and every
// checkpoint_interval positions of a long one. The scheduler ends a prompt chunk there
// (Chunk::checkpoint), the engine copies the sequence's state into the checkpoint slot
// after the step, and a later admission that hits copies it back (StepPlan::restores).
// Checkpoint slots are few (state_checkpoints) and reused least recently used first. Only
// blocks computed by prompt chunks that end at aligned positions are published for such
// a model (decode rows run the recurrence row by row, with other bits than a prefill).
#pragma once

#include <cstdint>
#include <deque>
#include <limits>
#include <unordered_map>
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
  // Prefix caching: the content hashes of the full blocks of `tokens` (kv_blocks.h), how
  // many leading blocks were offered to the cache, the positions a model with recurrent
  // state may publish (below the aligned end of what its prompt chunks computed), and the
  // tokens found cached at its first admission (-1: not admitted yet).
  std::vector<uint64_t> hashes;
  int published = 0;
  int cacheable = 0;
  int cached_tokens = -1;
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
  // >= 0: the chunk ends at a state checkpoint position; after the step the sequence's
  // state is copied into this checkpoint slot (0..state_checkpoints-1).
  int checkpoint = -1;
};

// An admitted sequence that starts from a cached prefix of a model with recurrent state:
// before the step, checkpoint slot `checkpoint` is copied into its state slot.
struct StateRestore {
  Sequence* seq = nullptr;
  int checkpoint = -1;
};

struct StepPlan {
  std::vector<Chunk> chunks;  // one per sequence; decode rows first
  int rows = 0;
  std::vector<Sequence*> admitted;   // waiting -> running in this plan
  std::vector<Sequence*> preempted;  // running -> waiting (blocks freed) in this plan
  std::vector<StateRestore> restores;
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
  // Prefix caching (see above). hash_extra: tokens after a block that its hash covers too
  // (1 for a model with an MTP head, whose cell at a block's last position pairs it with
  // the next token). With hash_extra > 0 blocks are published only by publish_running()
  // (the engine calls it after the head's pass over the step, which fills the head's cells
  // of the step's rows: the rows of a sequence that ended in the step get none, so what
  // it computed in its last step is not published).
  bool prefix_caching = false;
  int hash_extra = 0;
  // A model with recurrent state (ModelInfo::state_slots > 0): hits need a checkpoint.
  bool recurrent = false;
  int state_align = 1;          // the model's prefill alignment (ModelInfo::prefill_align)
  int state_checkpoints = 0;    // checkpoint slots (ModelInfo::state_checkpoints)
  int checkpoint_interval = 0;  // > 0: also every this many positions of a prompt
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
  // Prefix caching with hash_extra > 0: offers the running sequences' computed blocks.
  void publish_running();
  // Prefix caching: prompt tokens looked up and found at admissions (vLLM's
  // prefix_cache_queries / prefix_cache_hits), and checkpoint slots holding a state.
  uint64_t prefix_queries() const { return prefix_queries_; }
  uint64_t prefix_hits() const { return prefix_hits_; }
  int checkpoints_used() const;
  // The positions where state checkpoints are taken go in multiples of this.
  int checkpoint_granularity() const { return granularity_; }

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
  // Prefix caching: offers s's computed full blocks to the cache (`deferred`: also when
  // hash_extra > 0, from publish_running()).
  void publish(Sequence* s, bool deferred = false);
  // The cached blocks s can start from (a checkpoint's too for a recurrent model: then
  // *checkpoint is its slot, else -1).
  std::vector<int32_t> cached_prefix(Sequence* s, int* checkpoint);
  // The next checkpoint position after s's computed ones that a chunk should end at (0:
  // none).
  int next_checkpoint(const Sequence& s) const;
  int take_checkpoint();  // a slot for a checkpoint written by this plan's step

  SchedulerConfig config_;
  KvBlocks kv_;
  std::deque<Sequence*> waiting_;
  std::vector<Sequence*> running_;  // admission order
  std::vector<bool> slot_used_;
  uint64_t next_order_ = 0;
  int64_t step_ = 0;
  uint64_t preemptions_ = 0;
  PrefixHasher hasher_;
  int granularity_ = 1;
  uint64_t prefix_queries_ = 0, prefix_hits_ = 0;
  struct Checkpoint {
    uint64_t hash = 0;      // of the prefix's last block; 0: empty
    int64_t last_use = -1;  // step that wrote or restored it
    int64_t writing = -1;   // step whose chunk writes it (its hash is set at commit)
  };
  std::vector<Checkpoint> checkpoints_;
  std::unordered_map<uint64_t, int> checkpoint_of_;  // hash -> checkpoint slot
};

}  // namespace ninfer
