// The glibc floor of ninfer-server (README: 2.35, Ubuntu 22.04): the binary links
// libstdc++ and libgcc statically, and the libstdc++ of GCC 12 built on glibc 2.36 draws
// std::random_device's entropy from arc4random, a glibc 2.36 symbol (cpp-httplib's header
// constructs a random_device). This definition, from the kernel's pool as glibc's own is,
// keeps the server from needing a newer glibc than the floor.
#include <cstdint>

#include "server/random_id.h"

extern "C" uint32_t arc4random(void) noexcept { return static_cast<uint32_t>(ninfer::os_random()); }
