#include "text/unicode/nfc.h"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <tuple>
#include <utility>
#include <vector>

#include "text/unicode/nfc_tables.h"
#include "text/utf8.h"

namespace ninfer::unicode {
namespace {

using nfc_tables::kCombining;
using nfc_tables::kCompositions;
using nfc_tables::kDecompositions;

// Hangul syllable algorithm constants (Unicode 3.12).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28;
constexpr char32_t kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

uint8_t combining_class(char32_t cp) {
  if (cp < 0x300) return 0;
  const auto* end = std::end(kCombining);
  const auto* it = std::upper_bound(std::begin(kCombining), end, cp,
                                    [](char32_t c, const auto& r) { return c < r.first; });
  if (it == std::begin(kCombining)) return 0;
  --it;
  return cp <= it->last ? it->ccc : 0;
}

const nfc_tables::Decomposition* find_decomposition(char32_t cp) {
  const auto* end = std::end(kDecompositions);
  const auto* it = std::lower_bound(std::begin(kDecompositions), end, cp,
                                    [](const auto& d, char32_t c) { return d.cp < c; });
  return it != end && it->cp == cp ? it : nullptr;
}

void decompose(char32_t cp, std::vector<char32_t>& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const char32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out.push_back(kTBase + s % kTCount);
    return;
  }
  const auto* d = cp >= 0xC0 ? find_decomposition(cp) : nullptr;
  if (d == nullptr) {
    out.push_back(cp);
    return;
  }
  decompose(d->first, out);
  if (d->second != 0) decompose(d->second, out);
}

// The primary composite of (a, b), or 0.
char32_t compose(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount) {
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  }
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount) {
    return a + (b - kTBase);
  }
  const auto* end = std::end(kCompositions);
  const auto* it =
      std::lower_bound(std::begin(kCompositions), end, std::make_pair(a, b),
                       [](uint16_t i, const std::pair<char32_t, char32_t>& key) {
                         const auto& d = kDecompositions[i];
                         return d.first != key.first ? d.first < key.first : d.second < key.second;
                       });
  if (it == end) return 0;
  const auto& d = kDecompositions[*it];
  return d.first == a && d.second == b ? d.cp : 0;
}

// True if every byte is below 0xCC, i.e. all code points are below U+0300: such text is
// already in NFC (no combining marks, and everything decomposable there recomposes).
bool trivially_nfc(std::string_view text) {
  return std::all_of(text.begin(), text.end(),
                     [](char c) { return static_cast<unsigned char>(c) < 0xCC; });
}

}  // namespace

std::string nfc(std::string_view text) {
  if (trivially_nfc(text)) return std::string(text);
  std::vector<char32_t> cps;
  cps.reserve(text.size());
  for (size_t i = 0; i < text.size();) decompose(utf8::next(text, i), cps);

  std::vector<uint8_t> ccc(cps.size());
  for (size_t i = 0; i < cps.size(); ++i) ccc[i] = combining_class(cps[i]);
  // Canonical ordering: stable sort of each run of non-starters by combining class.
  for (size_t i = 0; i < cps.size();) {
    if (ccc[i] == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < cps.size() && ccc[j] != 0) ++j;
    if (j - i > 1) {
      std::vector<std::pair<uint8_t, char32_t>> run;
      for (size_t k = i; k < j; ++k) run.emplace_back(ccc[k], cps[k]);
      std::stable_sort(run.begin(), run.end(),
                       [](const auto& x, const auto& y) { return x.first < y.first; });
      for (size_t k = i; k < j; ++k) std::tie(ccc[k], cps[k]) = run[k - i];
    }
    i = j;
  }

  // Canonical composition.
  std::vector<char32_t> out;
  out.reserve(cps.size());
  std::ptrdiff_t starter = -1;
  uint8_t last_ccc = 0;
  for (size_t i = 0; i < cps.size(); ++i) {
    const uint8_t cc = ccc[i];
    if (starter >= 0) {
      const bool adjacent = static_cast<std::ptrdiff_t>(out.size()) - 1 == starter;
      if (adjacent || (last_ccc != 0 && last_ccc < cc)) {
        if (char32_t c = compose(out[starter], cps[i]); c != 0) {
          out[starter] = c;
          continue;
        }
      }
    }
    if (cc == 0) starter = static_cast<std::ptrdiff_t>(out.size());
    last_ccc = cc;
    out.push_back(cps[i]);
  }
  std::string result;
  result.reserve(text.size());
  for (char32_t c : out) utf8::append(result, c);
  return result;
}

}  // namespace ninfer::unicode
