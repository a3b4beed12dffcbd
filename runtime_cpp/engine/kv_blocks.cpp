#include "engine/kv_blocks.h"

#include <algorithm>
#include <iterator>
#include <random>
#include <stdexcept>
#include <string>

namespace ninfer {

namespace {

// A per-process key makes the chain hash unpredictable to clients (who could otherwise
// craft two prompts whose chains collide and read each other's keys/values; match()
// checks tokens too, so a collision can only make a miss, but only with the key are
// collisions as rare as 64 bits allow).
uint64_t process_key() {
  static const uint64_t key = [] {
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }();
  return key;
}

uint64_t mix(uint64_t x) {  // splitmix64's finalizer
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

uint64_t PrefixHasher::block_hash(uint64_t parent, const int32_t* tokens) const {
  uint64_t h = mix(parent ^ process_key());
  for (int i = 0; i < span(); ++i)
    h = mix(h ^ (static_cast<uint64_t>(static_cast<uint32_t>(tokens[i])) +
                 0x9e3779b97f4a7c15ull * (i + 1)));
  return h == 0 ? 1 : h;  // 0 means "not published"
}

void PrefixHasher::extend(std::vector<uint64_t>& hashes, const int32_t* tokens, int n) const {
  while (static_cast<int>(hashes.size() + 1) * block_size_ + extra_ <= n) {
    const size_t i = hashes.size();
    hashes.push_back(block_hash(i == 0 ? 0 : hashes[i - 1], tokens + i * block_size_));
  }
}

KvBlocks::KvBlocks(int num_blocks, int block_size)
    : block_size_(block_size), refs_(std::max(num_blocks, 1), 0) {
  if (block_size <= 0) throw std::invalid_argument("KV block size must be positive");
  if (num_blocks < 2)
    throw std::invalid_argument("the KV pool needs at least 2 blocks (block 0 is reserved), has " +
                                std::to_string(num_blocks));
  refs_[0] = 1;  // reserved for padding rows, never handed out
  if (num_blocks > 1) runs_.emplace(1, num_blocks - 1);
  plain_free_ = num_blocks - 1;
  hash_of_.assign(num_blocks, 0);
  parent_of_.assign(num_blocks, 0);
  prev_.assign(num_blocks, 0);
  next_.assign(num_blocks, 0);
}

void KvBlocks::lru_push(int32_t b) {
  const int32_t last = prev_[0];
  prev_[b] = last;
  next_[b] = 0;
  next_[last] = b;
  prev_[0] = b;
  ++lru_size_;
}

void KvBlocks::lru_remove(int32_t b) {
  next_[prev_[b]] = next_[b];
  prev_[next_[b]] = prev_[b];
  prev_[b] = next_[b] = 0;
  --lru_size_;
}

void KvBlocks::unpublish(int32_t b) {
  index_.erase(hash_of_[b]);
  hash_of_[b] = 0;
  parent_of_[b] = 0;
}

int32_t KvBlocks::take_free(int32_t after, int want) {
  auto it = runs_.end();
  int32_t b = 0;
  if (after > 0) {
    it = runs_.find(after + 1);
    if (it != runs_.end()) b = after + 1;
  }
  if (b == 0) {  // a new run: the largest free one (the first of equals)
    int32_t best = -1;
    for (auto r = runs_.begin(); r != runs_.end(); ++r)
      if (r->second - r->first > best) {
        best = r->second - r->first;
        it = r;
      }
    // Behind a held block (not the reserved block 0), leave the first half of what the
    // `want` blocks do not fill to that block's holder.
    const int32_t spare = it->second - it->first + 1 - want;
    b = it->first + (it->first > 1 && spare > 0 ? (spare + 1) / 2 : 0);
  }
  const int32_t first = it->first, last = it->second;
  runs_.erase(it);
  if (first < b) runs_.emplace(first, b - 1);
  if (b < last) runs_.emplace(b + 1, last);
  --plain_free_;
  return b;
}

void KvBlocks::put_free(int32_t b) {
  int32_t first = b, last = b;
  auto next = runs_.find(b + 1);
  if (next != runs_.end()) {
    last = next->second;
    runs_.erase(next);
  }
  auto it = runs_.lower_bound(b);
  if (it != runs_.begin()) {
    auto prev = std::prev(it);
    if (prev->second == b - 1) {
      first = prev->first;
      runs_.erase(prev);
    }
  }
  runs_.emplace(first, last);
  ++plain_free_;
}

bool KvBlocks::grow(std::vector<int32_t>& blocks, int tokens) {
  const int need = blocks_for(tokens) - static_cast<int>(blocks.size());
  if (need <= 0) return true;
  if (need > free()) return false;
  for (int i = 0; i < need; ++i) {
    int32_t b;
    if (plain_free_ > 0) {
      b = take_free(blocks.empty() ? 0 : blocks.back(), need - i);
    } else {  // evict the least recently used cached block
      b = next_[0];
      lru_remove(b);
      unpublish(b);
      ++evictions_;
    }
    refs_[b] = 1;
    blocks.push_back(b);
  }
  return true;
}

void KvBlocks::release(std::vector<int32_t>& blocks) {
  // From the last to the first, so that a sequence's cached tail goes to the LRU list (and
  // is evicted) before its head.
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
    const int32_t b = *it;
    if (b <= 0 || b >= static_cast<int32_t>(refs_.size()) || refs_[b] <= 0)
      throw std::logic_error("KV block " + std::to_string(b) + " released but not allocated");
    if (--refs_[b] == 0) {
      if (hash_of_[b] != 0) lru_push(b);
      else put_free(b);
    }
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

bool KvBlocks::publish(int32_t b, uint64_t hash, uint64_t parent, const int32_t* tokens, int span) {
  if (!caching_ || hash == 0) return false;
  if (b <= 0 || b >= static_cast<int32_t>(refs_.size()) || refs_[b] <= 0)
    throw std::logic_error("KV block " + std::to_string(b) + " published but not held");
  if (hash_of_[b] != 0 || index_.count(hash)) return false;
  if (span_ == 0) {
    span_ = span;
    tokens_of_.assign(refs_.size() * static_cast<size_t>(span), 0);
  } else if (span != span_) {
    throw std::logic_error("prefix cache: blocks published with spans " + std::to_string(span_) +
                           " and " + std::to_string(span));
  }
  index_.emplace(hash, b);
  hash_of_[b] = hash;
  parent_of_[b] = parent;
  std::copy(tokens, tokens + span, tokens_of_.begin() + static_cast<size_t>(b) * span);
  return true;
}

std::vector<int32_t> KvBlocks::match(const std::vector<uint64_t>& hashes, const int32_t* tokens,
                                     int n_tokens, int max_blocks) const {
  std::vector<int32_t> out;
  if (!caching_ || span_ == 0) return out;
  const int n = std::min(static_cast<int>(hashes.size()), max_blocks);
  for (int i = 0; i < n; ++i) {
    const size_t first = static_cast<size_t>(i) * block_size_;
    if (first + span_ > static_cast<size_t>(n_tokens)) break;
    auto it = index_.find(hashes[i]);
    if (it == index_.end()) break;
    const int32_t b = it->second;
    if (parent_of_[b] != (i == 0 ? 0 : hashes[i - 1]) ||
        !std::equal(tokens + first, tokens + first + span_,
                    tokens_of_.begin() + static_cast<size_t>(b) * span_))
      break;  // a hash collision: another prefix's block
    out.push_back(b);
  }
  return out;
}

int KvBlocks::unreferenced(const std::vector<int32_t>& blocks) const {
  int n = 0;
  for (int32_t b : blocks) n += refs_[b] == 0 ? 1 : 0;
  return n;
}

void KvBlocks::acquire(const std::vector<int32_t>& blocks, std::vector<int32_t>& to) {
  for (int32_t b : blocks) {
    if (b <= 0 || b >= static_cast<int32_t>(refs_.size()) || hash_of_[b] == 0)
      throw std::logic_error("KV block " + std::to_string(b) + " acquired but not cached");
    if (refs_[b]++ == 0) lru_remove(b);
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
