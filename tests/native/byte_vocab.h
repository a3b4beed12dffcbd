// A byte-level tokenizer.json for tests that need any text as tokens: one token per byte
// (ids 0..255, GPT-2's byte-to-character mapping, no merges) and, from id 256 on, the
// added tokens given (special or not). tests/test_output_parsers.py builds the same
// vocabulary in Python for the scripted fake server.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace ninfer::fake {

// The character GPT-2's byte-level BPE writes for byte `b`, as UTF-8.
inline std::string byte_char(int b) {
  int cp = b;
  const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
  if (!printable) {
    int n = 0;  // the rank of b among the bytes that are not printable
    for (int x = 0; x < b; ++x)
      if (!((x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE))) ++n;
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

inline nlohmann::json byte_tokenizer_json(
    const std::vector<std::pair<std::string, bool>>& added) {  // (content, special)
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  nlohmann::json tokens = nlohmann::json::array();
  for (size_t i = 0; i < added.size(); ++i)
    tokens.push_back({{"id", 256 + static_cast<int>(i)},
                      {"content", added[i].first},
                      {"special", added[i].second}});
  return {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
          {"decoder", {{"type", "ByteLevel"}}},
          {"added_tokens", tokens}};
}

}  // namespace ninfer::fake
