// The interface between the model-independent runtime and the generated model code
// (templates/model.cpp.j2 implements it for each compiled checkpoint).
//
// The model runs *steps*: one forward pass over a batch of token rows that may belong to
// several sequences (decode tokens of running requests and chunks of prompts together).
// Keys and values live in a paged pool of fixed-size blocks owned by the model; which
// blocks belong to which sequence is decided by the caller (the engine's block
// allocator) and passed in as block tables. Block 0 is reserved: padding rows write
// there and no sequence may own it.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace ninfer {

class Artifact;

struct ModelInfo {
  std::string model_id;
  std::string target;       // target profile name the kernels were built for
  std::string target_hash;  // Target.stable_hash() at compile time
  // Plan.build_digest() at compile time: the artifact must come from the same plan
  std::string build_digest;
  int vocab_size = 0;
  int max_context = 0;    // compiled maximum tokens per sequence
  int prefill_chunk = 0;  // compiled maximum rows per step (the step token budget)
  int num_layers = 0;
  int max_concurrency = 0;        // compiled maximum sequences per step (sequence slots)
  int kv_block_size = 0;          // tokens per KV block
  int kv_blocks = 0;              // blocks in the pool, block 0 reserved
  int blocks_per_seq = 0;         // block-table width: max_context / kv_block_size
  size_t kv_bytes_per_block = 0;  // all layers, keys and values
  std::string kv_dtype = "f32";   // KV-cache format (ninfer.kv_formats)
  // Recurrent-state slots (hybrid models: the Gated DeltaNet conv and SSM state; 0 for a
  // model without recurrent state): 1 + max_draft_tokens per sequence slot, sequence slot
  // s owning state slots s * (1 + max_draft_tokens) ... (state_group()). A sequence's state
  // lives in one of its slot's state slots (StepBatch::state_slots) and starts from zeros
  // at position 0, so a model with state cannot continue a sequence from KV blocks another
  // sequence computed. The others keep the states after a verify step's rows
  // (StepBatch::save_slots) until the accepted one becomes current.
  int state_slots = 0;
  // Prefix caching of a model with recurrent state: slots that hold the state after a
  // cached prefix (--state-checkpoints), numbered state_slots .. state_slots +
  // state_checkpoints - 1 for copy_state().
  int state_checkpoints = 0;
  // Positions at which a prompt's steps should end (SchedulerConfig::prefill_align): a
  // model whose results depend on where a prompt is cut (the chunked Gated DeltaNet
  // kernel cuts segments at multiples of its chunk) gets the same bits from every
  // schedule when the cuts are there. 1: any cut.
  int prefill_align = 1;
  // Rows whose logits one step may return (StepBatch::n_logits): max_concurrency, or with
  // speculative decoding max_concurrency x (1 + max_draft_tokens), at most prefill_chunk.
  int max_logit_rows = 0;
  // Speculative decoding the model was compiled for: "none", "ngram" (drafts proposed on
  // the host), "mtp"; a sequence brings up to max_draft_tokens drafts to a step.
  std::string spec = "none";
  int max_draft_tokens = 0;
  int logit_rows() const { return max_logit_rows > 0 ? max_logit_rows : max_concurrency; }
  int state_group() const { return state_slots > 0 ? 1 + max_draft_tokens : 0; }
};

// One step. Rows of one sequence should be contiguous with consecutive positions.
struct StepBatch {
  int n = 0;                           // rows, 1..prefill_chunk
  const int32_t* tokens = nullptr;     // [n]
  const int32_t* positions = nullptr;  // [n] position of each row in its sequence
  const int32_t* slots = nullptr;      // [n] sequence slot, 0..max_concurrency-1
  // [max_concurrency x blocks_per_seq] block ids of every slot (unused entries: 0). A
  // slot lists a block at most once. A block may appear in several slots' tables (the
  // shared prompt blocks of a request's choices); no row of the step writes into such a
  // block, so shared blocks are only read.
  const int32_t* block_tables = nullptr;
  int n_logits = 0;                     // rows whose logits are returned, 0..max_logit_rows
  const int32_t* logit_rows = nullptr;  // [n_logits] row indices into this step
  // Models with recurrent state (ModelInfo::state_slots > 0), else ignored:
  // [n] the state slot each row reads and updates in place, one per sequence of the step,
  // in its sequence slot's group (nullptr: the group's first). A row at position 0 starts
  // it from zeros.
  const int32_t* state_slots = nullptr;
  // [n] -1, or a state slot of the row's group that no row of the step updates: it receives
  // a copy of the state after the row (a draft row's state, kept so that the engine can
  // make it current if the verification stops there). nullptr: none.
  const int32_t* save_slots = nullptr;
};

// Device sampling (Model::samples_on_device): what the engine's host sampler
// (engine/sampling.h) applies to one logits row, in a form the device reads.
struct SampleEdit {  // one token's logits processors, applied in this order
  enum : uint32_t { kMask = 1, kBias = 2, kRepeat = 4, kOutput = 8 };
  int32_t token = 0;
  uint32_t flags = 0;  // kMask: -inf (min_tokens); kBias: += bias; kRepeat: l / r if l > 0
                       // else l * r (r = repetition_penalty); kOutput: l -= frequency, then
                       // l -= presence
  float bias = 0, frequency = 0, presence = 0;  // frequency: frequency_penalty x count
};
struct SampleRow {
  float temperature = 1, top_p = 1, min_p = 0, repetition_penalty = 1;
  int32_t top_k = 0;      // 0 or -1: off
  int32_t logprobs = -1;  // >= 0: the raw logprob and this many top alternatives (<= 20)
  uint64_t seed = 0;      // the draw is Philox4x32-10 keyed by seed at counter
  uint64_t counter = 0;   // the choice's token index
  const SampleEdit* edits = nullptr;  // one per token at most
  int n_edits = 0;
  const uint32_t* mask = nullptr;  // ceil(vocab / 32) words, bit set = allowed; nullptr: all
};
// Models compiled with --spec mtp (Model::draft): the draft head over the rows of the
// step that just ran, then its chains.
struct DraftBatch {
  // [step rows] the token at position positions[i] + 1 of row i's sequence, or -1 when
  // there is none yet (a prompt chunk's last row before the prompt's end is never -1: the
  // next prompt token; a rejected draft row is -1). The head runs over the rows that have
  // one and writes its own key/value at their positions; -1 rows read and write nothing.
  const int32_t* next = nullptr;
  // Sequences that draft: n_seqs of them, sequence j from step row rows[j] (its last
  // accepted row, next[rows[j]] >= 0), counts[j] (1..max_draft_tokens) greedy drafts at
  // positions positions[rows[j]] + 1 ..; the chain writes the head's keys/values at
  // positions up to positions[rows[j]] + counts[j] - 1, which `block_tables` (the step's,
  // grown to cover them) must hold.
  int n_seqs = 0;
  const int32_t* rows = nullptr;
  const int32_t* counts = nullptr;
  const int32_t* block_tables = nullptr;  // [max_concurrency x blocks_per_seq]
};

struct SampledToken {
  int32_t token = -1;                          // -1: every token was masked
  float logprob = 0;                           // raw (the model's log-softmax), when logprobs >= 0
  std::vector<std::pair<int32_t, float>> top;  // most likely first, ties by lower id
};

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelInfo& info() const = 0;
  // Runs one step: stores each row's key/value at its position in its slot's blocks,
  // attends each row to keys 0..position of its slot, and writes the logits of the
  // requested rows to `logits` (n_logits x vocab_size floats, row-major).
  virtual void step(const StepBatch& batch, float* logits) = 0;

  // Device sampling, instead of step(): launch() starts a step whose logits stay on the
  // device (it may return before they exist), then sample() draws one token for each of
  // its n_logits rows (rows[k] describes logits row k) and waits for them. Between the
  // two the engine builds the rows (constraint masks are computed while the step runs).
  virtual bool samples_on_device() const { return false; }
  virtual void launch(const StepBatch&) { no_device_sampling(); }
  virtual void sample(const SampleRow*, SampledToken*) { no_device_sampling(); }

  // --spec mtp: the draft head over the last step's rows (DraftBatch); writes sequence
  // j's drafts to drafts[j * max_draft_tokens ...] (counts[j] of them). Call after step()
  // or sample(), before the next step.
  virtual void draft(const DraftBatch&, int32_t*) {
    throw std::logic_error("this model has no MTP draft head (compile with --spec mtp)");
  }

  // Models with recurrent state: copies state slot `from` into state slot `to` (sequence
  // slots 0..state_slots-1, checkpoint slots after them), ordered with the steps before
  // and after it. Call between steps.
  virtual void copy_state(int from, int to) {
    (void)from;
    (void)to;
    throw std::logic_error("this model has no recurrent state to copy");
  }

  // One sequence in slot 0 with blocks 1..blocks_per_seq (for parity tests and tools
  // without an engine): `n` tokens at positions pos0.., logits of the last one.
  void forward(const int32_t* tokens, int n, int pos0, float* logits);

 private:
  [[noreturn]] static void no_device_sampling() {
    throw std::logic_error("this model returns logits (step): it does not sample on the device");
  }
};

// Compile-time facts about the generated model, available before loading weights.
const ModelInfo& compiled_model_info();
// Binds the artifact's weights (checked by name and shape) and allocates buffers.
std::unique_ptr<Model> create_model(const Artifact& artifact);

}  // namespace ninfer
