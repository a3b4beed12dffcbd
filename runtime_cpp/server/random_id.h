// The random ids the APIs give their objects: completions ("chatcmpl-..."), tool calls
// ("call_..."), Anthropic messages ("msg_...").
#pragma once

#include <random>
#include <string>
#include <string_view>

namespace ninfer {

inline constexpr std::string_view kIdLettersDigits =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
inline constexpr std::string_view kIdHexDigits = "0123456789abcdef";

// `prefix` and `n` characters drawn from `alphabet` (a generator per thread, seeded from
// std::random_device).
inline std::string random_id(std::string_view prefix, std::string_view alphabet, int n = 24) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string id(prefix);
  for (int i = 0; i < n; ++i) id += alphabet[rng() % alphabet.size()];
  return id;
}

}  // namespace ninfer
