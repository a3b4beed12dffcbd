#include "engine/stop_matcher.h"

#include <algorithm>

namespace ninfer {

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (auto& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

StopMatcher::Result StopMatcher::feed(const std::string& text, bool armed) {
  Result r;
  if (stopped_) return r;
  held_ += text;
  size_t first = std::string::npos;
  if (armed)
    for (const auto& s : stops_) {
      const size_t at = held_.find(s);
      if (at < first) {
        first = at;
        matched_ = s;
      }
    }
  if (first != std::string::npos) {
    r.text = held_.substr(0, first);
    r.stopped = stopped_ = true;
    held_.clear();
    return r;
  }
  // Keep the longest suffix of held_ that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const auto& s : stops_) {
    for (size_t len = std::min(s.size() - 1, held_.size()); len > keep; --len) {
      if (held_.compare(held_.size() - len, len, s, 0, len) == 0) {
        keep = len;
        break;
      }
    }
  }
  // Never split a UTF-8 sequence: move the cut back to a character boundary.
  size_t cut = held_.size() - keep;
  while (cut > 0 && cut < held_.size() && (static_cast<unsigned char>(held_[cut]) & 0xC0) == 0x80)
    --cut;
  r.text = held_.substr(0, cut);
  held_.erase(0, cut);
  return r;
}

StopMatcher::Result StopMatcher::finish(const std::string& text) {
  Result r = feed(text);
  if (!r.stopped) {
    r.text += held_;
    held_.clear();
  }
  return r;
}

}  // namespace ninfer
