// The glibc floor of ninfer-server (README: 2.35, Ubuntu 22.04): the binary links
// libstdc++ and libgcc statically, and the libstdc++ of GCC 12 built on glibc 2.36 draws
// std::random_device's entropy from arc4random, a glibc 2.36 symbol (cpp-httplib's header
// constructs a random_device). This definition, from the kernel's pool as glibc's own is,
// keeps the server from needing a newer glibc than the floor.
#include <sys/random.h>

#include <cstddef>
#include <cstdint>

extern "C" uint32_t arc4random(void) noexcept {
  uint32_t v = 0;
  size_t got = 0;
  while (got < sizeof v) {
    const ssize_t n = getrandom(reinterpret_cast<char*>(&v) + got, sizeof v - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
  }
  return v;
}
