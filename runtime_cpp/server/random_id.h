// The random ids the APIs give their objects: completions ("chatcmpl-..."), tool calls
// ("call_..."), Anthropic messages ("msg_...").
#pragma once

#include <sys/random.h>

#include <cstdint>
#include <random>
#include <string>
#include <string_view>

namespace ninfer {

inline constexpr std::string_view kIdLettersDigits =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
inline constexpr std::string_view kIdHexDigits = "0123456789abcdef";

// 64 bits from the kernel's random pool (getrandom, glibc 2.25). Not std::random_device:
// the static libstdc++ built against glibc 2.36 reads it with arc4random, which would raise
// the glibc the server needs above the README's floor.
inline uint64_t os_random() {
  uint64_t v = 0;
  size_t got = 0;
  while (got < sizeof v) {
    const ssize_t n = getrandom(reinterpret_cast<char*>(&v) + got, sizeof v - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
  }
  return v;
}

// `prefix` and `n` characters drawn from `alphabet` (a generator per thread, seeded from
// os_random()).
inline std::string random_id(std::string_view prefix, std::string_view alphabet, int n = 24) {
  static thread_local std::mt19937_64 rng{os_random()};
  std::string id(prefix);
  for (int i = 0; i < n; ++i) id += alphabet[rng() % alphabet.size()];
  return id;
}

}  // namespace ninfer
