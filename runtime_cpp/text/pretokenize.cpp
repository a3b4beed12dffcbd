#include "text/pretokenize.h"

#include <algorithm>

#include "text/utf8.h"

namespace ninfer::tok {
namespace {

struct Span {
  size_t start;
  size_t end;
  bool flag;  // is-a-match while matching, then remove-this-span
};

std::vector<Span> find_spans(std::string_view text, const Regex& regex, bool invert) {
  std::vector<Span> spans;
  if (text.empty()) return {{0, 0, invert}};
  size_t prev = 0;
  for (const auto& [start, end] : regex.find_all(text)) {
    if (prev != start) spans.push_back({prev, start, invert});
    spans.push_back({start, end, !invert});
    prev = end;
  }
  if (prev != text.size()) spans.push_back({prev, text.size(), invert});
  return spans;
}

void apply_step(const PreTokenizerStep& step, std::string_view text,
                std::vector<std::string>& out) {
  if (step.kind == PreTokenizerStep::Kind::kSplit) {
    for (const auto& [start, end] : split_text(text, *step.regex, step.behavior, step.invert)) {
      out.emplace_back(text.substr(start, end - start));
    }
    return;
  }
  std::string prefixed;
  if (step.add_prefix_space && !text.empty() && text.front() != ' ') {
    prefixed.reserve(text.size() + 1);
    prefixed += ' ';
    prefixed += text;
    text = prefixed;
  }
  if (!step.use_regex) {
    if (!text.empty()) out.push_back(utf8::to_byte_level(text));
    return;
  }
  for (const auto& [start, end] : split_text(text, gpt2_regex(), SplitBehavior::kIsolated, false)) {
    out.push_back(utf8::to_byte_level(text.substr(start, end - start)));
  }
}

}  // namespace

std::vector<std::pair<size_t, size_t>> split_text(std::string_view text, const Regex& regex,
                                                  SplitBehavior behavior, bool invert) {
  std::vector<Span> spans = find_spans(text, regex, invert);
  std::vector<Span> pieces;
  pieces.reserve(spans.size());
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (auto s : spans) pieces.push_back({s.start, s.end, false});
      break;
    case SplitBehavior::kRemoved: pieces = spans; break;
    case SplitBehavior::kContiguous:
      for (auto s : spans) {
        if (s.flag == previous_match && !pieces.empty()) {
          pieces.back().end = s.end;
        } else {
          pieces.push_back({s.start, s.end, false});
        }
        previous_match = s.flag;
      }
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (auto s : spans) {
        if (s.flag && !previous_match && !pieces.empty()) {
          pieces.back().end = s.end;
        } else {
          pieces.push_back({s.start, s.end, false});
        }
        previous_match = s.flag;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->flag && !previous_match && !pieces.empty()) {
          pieces.back().start = it->start;
        } else {
          pieces.push_back({it->start, it->end, false});
        }
        previous_match = it->flag;
      }
      std::reverse(pieces.begin(), pieces.end());
      break;
  }
  std::vector<std::pair<size_t, size_t>> out;
  out.reserve(pieces.size());
  for (const auto& p : pieces) {
    if (!p.flag && p.end > p.start) out.emplace_back(p.start, p.end);
  }
  return out;
}

void PreTokenizer::run(std::string_view text, std::vector<std::string>& out) const {
  if (text.empty()) return;
  if (steps.empty()) {
    out.emplace_back(text);
    return;
  }
  std::vector<std::string> current{std::string(text)};
  std::vector<std::string> next;
  for (const auto& step : steps) {
    next.clear();
    for (const auto& piece : current) apply_step(step, piece, next);
    current.swap(next);
  }
  for (auto& piece : current) out.push_back(std::move(piece));
}

const Regex& gpt2_regex() {
  static const Regex regex(
      translate_oniguruma_pattern(
          R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)"),
      "ByteLevel pre-tokenizer");
  return regex;
}

}  // namespace ninfer::tok
