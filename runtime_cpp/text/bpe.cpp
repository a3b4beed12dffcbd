#include "text/bpe.h"

#include <mutex>
#include <queue>
#include <stdexcept>

#include "text/utf8.h"

namespace ninfer::tok {

BpeModel::BpeModel(BpeConfig config) : config_(std::move(config)) {
  vocab_.reserve(config_.vocab.size());
  for (const auto& [token, id] : config_.vocab) vocab_[token] = id;
  config_.vocab.clear();
  const size_t prefix_len =
      config_.continuing_subword_prefix ? config_.continuing_subword_prefix->size() : 0;
  merges_.reserve(config_.merges.size());
  for (size_t rank = 0; rank < config_.merges.size(); ++rank) {
    const auto& [a, b] = config_.merges[rank];
    const auto ia = vocab_.find(a);
    const auto ib = vocab_.find(b);
    if (ia == vocab_.end() || ib == vocab_.end()) {
      throw std::runtime_error("tokenizer.json: BPE merge '" + a + " " + b +
                               "' uses a token missing from the vocabulary");
    }
    const std::string merged = a + (b.size() >= prefix_len ? b.substr(prefix_len) : b);
    const auto im = vocab_.find(merged);
    if (im == vocab_.end()) {
      throw std::runtime_error("tokenizer.json: BPE merge '" + a + " " + b + "' produces '" +
                               merged + "', missing from the vocabulary");
    }
    // Like HF (collecting into a map), a repeated pair keeps its last rank.
    merges_[pair_key(ia->second, ib->second)] = {static_cast<uint32_t>(rank), im->second};
  }
  config_.merges.clear();
  if (config_.unk_token) {
    if (auto it = vocab_.find(*config_.unk_token); it != vocab_.end()) unk_id_ = it->second;
  }
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  const auto it = vocab_.find(std::string(token));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const BpeModel::Merge* BpeModel::find_merge(int32_t a, int32_t b) const {
  const auto it = merges_.find(pair_key(a, b));
  return it == merges_.end() ? nullptr : &it->second;
}

void BpeModel::tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (config_.ignore_merges) {
    if (auto id = token_to_id(word)) {
      out.push_back(*id);
      return;
    }
  }
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  std::string key;
  if (cacheable) {
    key = std::string(word);
    std::shared_lock lock(cache_mutex_);
    if (const auto it = cache_.find(key); it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids = merge_word(word);
  out.insert(out.end(), ids.begin(), ids.end());
  if (cacheable) {
    std::unique_lock lock(cache_mutex_);
    if (cache_.size() >= kCacheCapacity) cache_.clear();
    cache_.emplace(std::move(key), std::move(ids));
  }
}

std::vector<int32_t> BpeModel::merge_word(std::string_view word) const {
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    bool alive;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  auto add_symbol = [&](int32_t id) {
    const auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, index - 1, index + 1, true});
  };
  // Initial symbols: one per character (with prefix/suffix), unknown ones through unk.
  int32_t pending_unk = -1;  // an unk symbol not emitted yet (fuse_unk extends it)
  for (size_t i = 0; i < word.size();) {
    const size_t start = i;
    utf8::next(word, i);
    std::string piece(word.substr(start, i - start));
    if (start > 0 && config_.continuing_subword_prefix) {
      piece = *config_.continuing_subword_prefix + piece;
    }
    if (i >= word.size() && config_.end_of_word_suffix) piece += *config_.end_of_word_suffix;
    if (const auto it = vocab_.find(piece); it != vocab_.end()) {
      if (pending_unk >= 0) add_symbol(pending_unk);
      pending_unk = -1;
      add_symbol(it->second);
    } else if (config_.unk_token) {
      if (!unk_id_) {
        throw std::runtime_error("BPE unk_token '" + *config_.unk_token +
                                 "' is not in the vocabulary");
      }
      if (pending_unk >= 0 && !config_.fuse_unk) add_symbol(pending_unk);
      pending_unk = *unk_id_;
    }
    // Without an unk token, unknown characters are dropped, as in HF.
  }
  if (pending_unk >= 0) add_symbol(pending_unk);
  if (symbols.empty()) return {};
  symbols.back().next = -1;

  // Apply merges lowest rank first, leftmost first among equal ranks.
  struct Candidate {
    uint32_t rank;
    int32_t pos;
    int32_t new_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const Merge* m = find_merge(symbols[i].id, symbols[i + 1].id)) {
      queue.push({m->rank, static_cast<int32_t>(i), m->new_id});
    }
  }
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    const Merge* m = find_merge(left.id, right.id);
    if (m == nullptr || m->new_id != top.new_id) continue;  // stale entry
    left.id = top.new_id;
    right.alive = false;
    left.next = right.next;
    if (left.next >= 0) symbols[left.next].prev = top.pos;
    if (left.prev >= 0) {
      if (const Merge* pm = find_merge(symbols[left.prev].id, left.id)) {
        queue.push({pm->rank, left.prev, pm->new_id});
      }
    }
    if (left.next >= 0) {
      if (const Merge* nm = find_merge(left.id, symbols[left.next].id)) {
        queue.push({nm->rank, top.pos, nm->new_id});
      }
    }
  }
  std::vector<int32_t> ids;
  for (const Symbol& s : symbols) {
    if (s.alive) ids.push_back(s.id);
  }
  return ids;
}

}  // namespace ninfer::tok
