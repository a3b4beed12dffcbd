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
#include <string>

namespace ninfer {

class Artifact;

struct ModelInfo {
  std::string model_id;
  std::string target;       // target profile name the kernels were built for
  std::string target_hash;  // Target.stable_hash() at compile time
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
  int n_logits = 0;                     // rows whose logits are returned, 0..max_concurrency
  const int32_t* logit_rows = nullptr;  // [n_logits] row indices into this step
};

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelInfo& info() const = 0;
  // Runs one step: stores each row's key/value at its position in its slot's blocks,
  // attends each row to keys 0..position of its slot, and writes the logits of the
  // requested rows to `logits` (n_logits x vocab_size floats, row-major).
  virtual void step(const StepBatch& batch, float* logits) = 0;

  // One sequence in slot 0 with blocks 1..blocks_per_seq (for parity tests and tools
  // without an engine): `n` tokens at positions pos0.., logits of the last one.
  void forward(const int32_t* tokens, int n, int pos0, float* logits);
};

// Compile-time facts about the generated model, available before loading weights.
const ModelInfo& compiled_model_info();
// Binds the artifact's weights (checked by name and shape) and allocates buffers.
std::unique_ptr<Model> create_model(const Artifact& artifact);

}  // namespace ninfer
