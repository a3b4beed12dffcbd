// Stop strings over streamed text: text that might be the start of a stop string is
// held back until it is known not to be.
#pragma once

#include <string>
#include <vector>

namespace ninfer {

class StopMatcher {
 public:
  struct Result {
    std::string text;  // safe to emit now
    bool stopped = false;
  };
  explicit StopMatcher(std::vector<std::string> stops);
  // `armed` false: no stop string may end in this text (min_tokens not reached yet); a
  // suffix that may start one is still held back.
  Result feed(const std::string& text, bool armed = true);
  Result finish(const std::string& text);  // end of generation: release what is held
  bool stopped() const { return stopped_; }
  // The stop string that ended the text (the one that starts first), once stopped().
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  std::string matched_;
  bool stopped_ = false;
};

}  // namespace ninfer
