// Paged KV accounting: which blocks of the model's pool are free. Block 0 is reserved
// (padding rows write there), so blocks 1..num_blocks-1 are handed out. Not thread-safe:
// only the engine loop touches it.
#pragma once

#include <cstdint>
#include <vector>

namespace ninfer {

class KvBlocks {
 public:
  // `num_blocks` counts the reserved block 0 (ModelInfo::kv_blocks).
  KvBlocks(int num_blocks, int block_size);

  int block_size() const { return block_size_; }
  int total() const { return static_cast<int>(owned_.size()) - 1; }  // usable blocks
  int free() const { return static_cast<int>(free_.size()); }
  int used() const { return total() - free(); }
  // Blocks needed to hold `tokens` positions.
  int blocks_for(int tokens) const { return (tokens + block_size_ - 1) / block_size_; }

  // Appends blocks to `blocks` until it covers `tokens` positions; all or nothing:
  // false (and `blocks` unchanged) when the pool has too few free blocks.
  bool grow(std::vector<int32_t>& blocks, int tokens);
  // Returns every block of `blocks` to the pool and clears it.
  void release(std::vector<int32_t>& blocks);

 private:
  int block_size_;
  std::vector<int32_t> free_;  // stack; the lowest id is handed out first
  std::vector<bool> owned_;    // owned_[b]: b is allocated (catches double frees)
};

// Fills `tables` [rows x width] with each row's block ids, 0 for unused entries.
// `seq_blocks[r]` may be null (an empty slot).
void fill_block_tables(int32_t* tables, int rows, int width,
                       const std::vector<const std::vector<int32_t>*>& seq_blocks);

}  // namespace ninfer
