// Draft sources for the speculation tests (test_speculate.cpp, test_device_sampling.cpp):
// an oracle that proposes a known continuation, and random drafts.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "engine/drafter.h"
#include "fake_model.h"

namespace ninfer::fake {

// Proposes the next tokens of `ref` (a sequence's prompt and its plain output) while what
// was appended is a prefix of it; nothing once they diverge. `partial`: proposal i has its
// draft i % (k + 1) replaced by another token (none when that is k), so verifications stop
// at every draft position in turn.
class OracleDrafter : public Drafter {
 public:
  explicit OracleDrafter(std::vector<int32_t> ref, bool partial = false)
      : ref_(std::move(ref)), partial_(partial) {}
  void append(int32_t t) override {
    on_track_ = on_track_ && n_ < ref_.size() && ref_[n_] == t;
    ++n_;
  }
  std::vector<int32_t> propose(int k) const override {
    if (!on_track_ || n_ >= ref_.size()) return {};
    std::vector<int32_t> d(
        ref_.begin() + static_cast<std::ptrdiff_t>(n_),
        ref_.begin() + static_cast<std::ptrdiff_t>(std::min(ref_.size(), n_ + k)));
    if (partial_) {
      const size_t miss = proposals_++ % static_cast<size_t>(k + 1);
      if (miss < d.size()) d[miss] = (d[miss] + 1) % kVocab;
    }
    return d;
  }

 private:
  std::vector<int32_t> ref_;
  bool partial_;
  size_t n_ = 0;
  bool on_track_ = true;
  mutable size_t proposals_ = 0;
};

// 0..k random tokens (0 about a third of the time; `always`: k of them): rejected almost
// always.
class RandomDrafter : public Drafter {
 public:
  explicit RandomDrafter(uint64_t seed, bool always = false) : rng_(seed), always_(always) {}
  void append(int32_t) override {}
  std::vector<int32_t> propose(int k) const override {
    const int n = always_ ? k : static_cast<int>(rng_() % 3 == 0 ? 0 : rng_() % (k + 1));
    std::vector<int32_t> d(n);
    for (int32_t& t : d) t = static_cast<int32_t>(rng_() % kVocab);
    return d;
  }

 private:
  mutable std::mt19937_64 rng_;
  bool always_;
};

// An MTP head's drafts for FakeModel::set_mtp: random tokens of the full count.
inline FakeModel::MtpDrafts random_mtp(uint64_t seed) {
  auto rng = std::make_shared<std::mt19937_64>(seed);
  return [rng](const std::vector<int32_t>&, int count) {
    std::vector<int32_t> chain(static_cast<size_t>(count));
    for (int32_t& t : chain) t = static_cast<int32_t>((*rng)() % kVocab);
    return chain;
  };
}

}  // namespace ninfer::fake
