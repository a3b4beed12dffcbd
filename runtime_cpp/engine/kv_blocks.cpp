#include "engine/kv_blocks.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace ninfer {

KvBlocks::KvBlocks(int num_blocks, int block_size)
    : block_size_(block_size), refs_(std::max(num_blocks, 1), 0) {
  if (block_size <= 0) throw std::invalid_argument("KV block size must be positive");
  if (num_blocks < 2)
    throw std::invalid_argument("the KV pool needs at least 2 blocks (block 0 is reserved), has " +
                                std::to_string(num_blocks));
  refs_[0] = 1;  // reserved for padding rows, never handed out
  free_.reserve(num_blocks - 1);
  for (int b = num_blocks - 1; b >= 1; --b) free_.push_back(b);
}

bool KvBlocks::grow(std::vector<int32_t>& blocks, int tokens) {
  const int need = blocks_for(tokens) - static_cast<int>(blocks.size());
  if (need <= 0) return true;
  if (need > free()) return false;
  for (int i = 0; i < need; ++i) {
    const int32_t b = free_.back();
    free_.pop_back();
    refs_[b] = 1;
    blocks.push_back(b);
  }
  return true;
}

void KvBlocks::release(std::vector<int32_t>& blocks) {
  // Pushed in reverse so that a sequence's blocks come back in the order it got them.
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
    const int32_t b = *it;
    if (b <= 0 || b >= static_cast<int32_t>(refs_.size()) || refs_[b] <= 0)
      throw std::logic_error("KV block " + std::to_string(b) + " released but not allocated");
    if (--refs_[b] == 0) free_.push_back(b);
  }
  blocks.clear();
}

void KvBlocks::shrink(std::vector<int32_t>& blocks, int tokens) {
  const size_t keep = static_cast<size_t>(std::max(0, blocks_for(tokens)));
  if (blocks.size() <= keep) return;
  std::vector<int32_t> tail(blocks.begin() + static_cast<std::ptrdiff_t>(keep), blocks.end());
  blocks.resize(keep);
  release(tail);
}

void KvBlocks::share(const std::vector<int32_t>& from, int count, std::vector<int32_t>& to) {
  if (count < 0 || count > static_cast<int>(from.size()))
    throw std::logic_error("sharing " + std::to_string(count) + " KV blocks of a sequence that " +
                           "holds " + std::to_string(from.size()));
  for (int i = 0; i < count; ++i) {
    const int32_t b = from[i];
    if (b <= 0 || b >= static_cast<int32_t>(refs_.size()) || refs_[b] <= 0)
      throw std::logic_error("KV block " + std::to_string(b) + " shared but not allocated");
    ++refs_[b];
    to.push_back(b);
  }
}

void fill_block_tables(int32_t* tables, int rows, int width,
                       const std::vector<const std::vector<int32_t>*>& seq_blocks) {
  std::fill(tables, tables + static_cast<size_t>(rows) * width, 0);
  const int n = std::min<int>(rows, static_cast<int>(seq_blocks.size()));
  for (int r = 0; r < n; ++r) {
    const std::vector<int32_t>* b = seq_blocks[r];
    if (!b) continue;
    if (static_cast<int>(b->size()) > width)
      throw std::logic_error("sequence holds " + std::to_string(b->size()) +
                             " KV blocks, the block table has room for " + std::to_string(width));
    std::copy(b->begin(), b->end(), tables + static_cast<size_t>(r) * width);
  }
}

}  // namespace ninfer
