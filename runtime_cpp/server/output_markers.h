// Internal to OutputParser (output_parser.cpp: the reasoning and the parser's frame;
// tool_call_parser.cpp: the tool-call formats): the markers the formats write, and the
// scanning of streamed text for them.
#pragma once

#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <string_view>

namespace ninfer::output_markers {

inline constexpr const char* kWs = " \t\r\n";
inline constexpr std::string_view kThinkOpen = "<think>";
inline constexpr std::string_view kThinkClose = "</think>";
inline constexpr std::string_view kToolOpen = "<tool_call>";
inline constexpr std::string_view kToolClose = "</tool_call>";
inline constexpr std::string_view kFunctionOpen = "<function=";
inline constexpr std::string_view kFunctionClose = "</function>";
inline constexpr std::string_view kParameterOpen = "<parameter=";
inline constexpr std::string_view kParameterClose = "</parameter>";
inline constexpr std::string_view kPythonTag = "<|python_tag|>";

inline bool starts_with(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
}

// `s` is a proper prefix of `marker` (more text could complete it).
inline bool is_partial(std::string_view s, std::string_view marker) {
  return s.size() < marker.size() && marker.compare(0, s.size(), s) == 0;
}

// The longest suffix of `s` that is a proper prefix of `marker`.
inline size_t partial_suffix(std::string_view s, std::string_view marker) {
  for (size_t k = std::min(s.size(), marker.size() - 1); k > 0; --k)
    if (s.compare(s.size() - k, k, marker, 0, k) == 0) return k;
  return 0;
}

// How many bytes at the end of `text` to hold back while more text may come: the longest
// tail that could still grow into one of `markers` (nothing once the text is final).
inline size_t held_back(std::string_view text, bool final,
                        std::initializer_list<std::string_view> markers) {
  size_t keep = 0;
  if (!final)
    for (std::string_view m : markers) keep = std::max(keep, partial_suffix(text, m));
  return keep;
}

}  // namespace ninfer::output_markers
