// Paged KV accounting: which blocks of the model's pool are free. Block 0 is reserved
// (padding rows write there), so blocks 1..num_blocks-1 are handed out. A block may be
// shared by several sequences (the full prompt blocks of a request's n choices): it is
// reference-counted and returns to the pool when its last holder releases it; a shared
// block is only ever read (the scheduler never gives a sequence rows in a block it
// shares). Not thread-safe: only the engine loop touches it.
#pragma once

#include <cstdint>
#include <vector>

namespace ninfer {

class KvBlocks {
 public:
  // `num_blocks` counts the reserved block 0 (ModelInfo::kv_blocks).
  KvBlocks(int num_blocks, int block_size);

  int block_size() const { return block_size_; }
  int total() const { return static_cast<int>(refs_.size()) - 1; }  // usable blocks
  int free() const { return static_cast<int>(free_.size()); }
  int used() const { return total() - free(); }
  // Blocks needed to hold `tokens` positions.
  int blocks_for(int tokens) const { return (tokens + block_size_ - 1) / block_size_; }

  // Appends blocks to `blocks` until it covers `tokens` positions; all or nothing:
  // false (and `blocks` unchanged) when the pool has too few free blocks.
  bool grow(std::vector<int32_t>& blocks, int tokens);
  // Appends the first `count` blocks of `from` to `to`, one more reference each.
  void share(const std::vector<int32_t>& from, int count, std::vector<int32_t>& to);
  // Drops the blocks of `blocks` past those that cover `tokens` positions (one reference
  // each): what speculative decoding's rejected draft rows leave behind.
  void shrink(std::vector<int32_t>& blocks, int tokens);
  // Drops one reference to every block of `blocks` (a block returns to the pool with its
  // last) and clears it.
  void release(std::vector<int32_t>& blocks);
  int refs(int32_t block) const { return refs_[block]; }

 private:
  int block_size_;
  std::vector<int32_t> free_;  // stack; the lowest id is handed out first
  std::vector<int> refs_;      // refs_[b]: holders of b, 0 = free (catches double frees)
};

// Fills `tables` [rows x width] with each row's block ids, 0 for unused entries.
// `seq_blocks[r]` may be null (an empty slot).
void fill_block_tables(int32_t* tables, int rows, int width,
                       const std::vector<const std::vector<int32_t>*>& seq_blocks);

}  // namespace ninfer
