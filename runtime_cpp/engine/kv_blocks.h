// Paged KV accounting: which blocks of the model's pool are free, and the prefix cache.
// Block 0 is reserved (padding rows write there), so blocks 1..num_blocks-1 are handed
// out. Placement keeps a sequence's blocks consecutive where it can (a KV layout with one
// plane a kv head, the CPU plan's, makes consecutive blocks one stream for decode
// attention's prefetch): a growing sequence takes the block after its last one when that
// is free; a sequence starting, or one whose next block is taken, starts a new run in the
// largest free run, centred in what it leaves spare when a held block precedes the run
// (whoever holds that block may grow into the first half), so sequences that grow in step
// do not interleave their blocks. A block may be shared by several sequences (the full
// prompt blocks of a request's n choices, or a cached prefix): it is reference-counted and
// returns to the pool when its last holder releases it; a shared block is only ever read
// (the scheduler never gives a sequence rows in a block it shares). Not thread-safe: only
// the engine loop touches it.
//
// Prefix cache (set_caching): a full block whose keys/values are final can be published
// under the hash of its content, which is the hash of its parent block's content and its
// own tokens (a chain from the sequence's first block, PrefixHasher), so equal hashes mean
// equal token prefixes and, the kernels being row-independent, bitwise equal keys/values.
// A published block that its last holder releases is not freed: it stays cached, at the
// most-recently-used end of an LRU list, and counts as free (grow() evicts the least
// recently used one when no plain free block is left, unpublishing it). match() finds the
// longest chain of cached blocks for a token sequence; every block it returns is checked
// against the tokens and the parent hash it was published with, so a hash collision is a
// miss, never wrong keys/values. acquire() takes them (out of the LRU list while held).
#pragma once

#include <cstdint>
#include <map>
#include <unordered_map>
#include <vector>

namespace ninfer {

// The hash chain of a sequence's full blocks: hash(i) covers tokens [0, (i + 1) * block).
// `extra` tokens after each block also count (a model whose block holds something that
// depends on the following token: the MTP head's cell at a block's last position pairs it
// with the next token); a block is then hashable only once those are known.
class PrefixHasher {
 public:
  PrefixHasher(int block_size, int extra) : block_size_(block_size), extra_(extra) {}
  // Extends `hashes` over every full block of `tokens[0, n)` it does not cover yet.
  void extend(std::vector<uint64_t>& hashes, const int32_t* tokens, int n) const;
  // The hash of one block from its parent's (0 for the first block) and its tokens
  // (block_size + extra of them).
  uint64_t block_hash(uint64_t parent, const int32_t* tokens) const;
  int span() const { return block_size_ + extra_; }  // tokens one block's hash reads
  int block_size() const { return block_size_; }

 private:
  int block_size_, extra_;
};

class KvBlocks {
 public:
  // `num_blocks` counts the reserved block 0 (ModelInfo::kv_blocks).
  KvBlocks(int num_blocks, int block_size);

  int block_size() const { return block_size_; }
  int total() const { return static_cast<int>(refs_.size()) - 1; }  // usable blocks
  // Blocks grow() can hand out: never used, or cached and unreferenced (evictable).
  int free() const { return plain_free_ + lru_size_; }
  int used() const { return total() - free(); }
  // Blocks needed to hold `tokens` positions.
  int blocks_for(int tokens) const { return (tokens + block_size_ - 1) / block_size_; }

  // Appends blocks to `blocks` until it covers `tokens` positions; all or nothing:
  // false (and `blocks` unchanged) when the pool has too few free blocks. Takes plain
  // free blocks first (placed as the header says), then evicts cached ones, least
  // recently used first.
  bool grow(std::vector<int32_t>& blocks, int tokens);
  // Appends the first `count` blocks of `from` to `to`, one more reference each.
  void share(const std::vector<int32_t>& from, int count, std::vector<int32_t>& to);
  // Drops the blocks of `blocks` past those that cover `tokens` positions (one reference
  // each): what speculative decoding's rejected draft rows leave behind.
  void shrink(std::vector<int32_t>& blocks, int tokens);
  // Drops one reference to every block of `blocks` (a block returns to the pool, or to
  // the cache when published, with its last) and clears it. Blocks are released from the
  // last to the first, so a sequence's tail is evicted before its head.
  void release(std::vector<int32_t>& blocks);
  int refs(int32_t block) const { return refs_[block]; }

  // ---- prefix cache
  void set_caching(bool on) { caching_ = on; }
  bool caching() const { return caching_; }
  // Publishes `block` (held, full, its keys/values final) as the block with `hash`, whose
  // parent hash is `parent` and whose tokens are `tokens` (span of them). False (nothing
  // changes) when caching is off, the block is published already, or another block holds
  // that content (a duplicate computed at the same time: it stays private).
  bool publish(int32_t block, uint64_t hash, uint64_t parent, const int32_t* tokens, int span);
  // The cached blocks of the longest prefix of `hashes` (at most `max_blocks`) whose
  // published tokens match `tokens` (span per block, from block i's first position).
  std::vector<int32_t> match(const std::vector<uint64_t>& hashes, const int32_t* tokens,
                             int n_tokens, int max_blocks) const;
  // Appends `blocks` (found by match) to `to`, one more reference each; an unreferenced
  // cached block leaves the LRU list while held.
  void acquire(const std::vector<int32_t>& blocks, std::vector<int32_t>& to);
  // How many of `blocks` are unreferenced (acquiring them takes them out of free()).
  int unreferenced(const std::vector<int32_t>& blocks) const;
  bool published(int32_t block) const { return hash_of_[block] != 0; }
  uint64_t hash(int32_t block) const { return hash_of_[block]; }
  int cached() const { return static_cast<int>(index_.size()); }  // published blocks
  uint64_t evictions() const { return evictions_; }

 private:
  void unpublish(int32_t block);
  void lru_push(int32_t block);  // at the most recently used end
  void lru_remove(int32_t block);
  // A plain free block for a sequence whose last block is `after` (0: none) and which
  // needs `want` blocks more, `after + 1` where free.
  int32_t take_free(int32_t after, int want);
  void put_free(int32_t block);

  int block_size_;
  std::map<int32_t, int32_t> runs_;  // plain free blocks as runs: first -> last (inclusive)
  int plain_free_ = 0;               // blocks in runs_
  std::vector<int> refs_;  // refs_[b]: holders of b, 0 = free or cached (catches double frees)
  bool caching_ = false;
  std::unordered_map<uint64_t, int32_t> index_;  // content hash -> the block holding it
  std::vector<uint64_t> hash_of_, parent_of_;    // per block (0: not published)
  std::vector<int32_t> tokens_of_;               // per block, span tokens when published
  int span_ = 0;
  // LRU list of unreferenced published blocks through prev/next (block 0: the sentinel;
  // next_[0] is the least recently used).
  std::vector<int32_t> prev_, next_;
  int lru_size_ = 0;
  uint64_t evictions_ = 0;
};

// Fills `tables` [rows x width] with each row's block ids, 0 for unused entries.
// `seq_blocks[r]` may be null (an empty slot).
void fill_block_tables(int32_t* tables, int rows, int width,
                       const std::vector<const std::vector<int32_t>*>& seq_blocks);

}  // namespace ninfer
