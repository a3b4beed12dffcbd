// CHECK for the native tests: on failure, print where and exit 1 (the Python side shows
// stderr). Always on, whatever NDEBUG says.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#define CHECK(cond)                                                                 \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      std::exit(1);                                                                 \
    }                                                                               \
  } while (0)

namespace ninfer::fake {

[[noreturn]] inline void fail(const std::string& what) {
  std::fprintf(stderr, "%s\n", what.c_str());
  std::exit(1);
}

}  // namespace ninfer::fake
