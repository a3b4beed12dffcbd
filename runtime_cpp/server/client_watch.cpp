#include "server/client_watch.h"

#include <dirent.h>
#include <netdb.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>

namespace ninfer {
namespace {

// `host` empty: compare the port only.
bool same_endpoint(const sockaddr_storage& a, socklen_t len, const std::string& host, int port) {
  char h[NI_MAXHOST], p[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&a), len, h, sizeof h, p, sizeof p,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return false;
  return (host.empty() || host == h) && port == std::atoi(p);
}

// Calls `each(fd)` for this process's open descriptors, in order, until it returns true:
// listed by `fd_dir` (/proc/self/fd), or where that cannot be read (a root without /proc,
// as a minimal container gives) every number below the descriptor limit (at most 65536),
// the closed ones failing their first call cheaply.
template <typename F>
void for_each_descriptor(const char* fd_dir, F each) {
  if (DIR* dir = opendir(fd_dir)) {
    while (dirent* e = readdir(dir)) {
      if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
      if (each(std::atoi(e->d_name))) break;
    }
    closedir(dir);
    return;
  }
  rlimit lim{};
  const rlim_t top = getrlimit(RLIMIT_NOFILE, &lim) == 0 ? lim.rlim_cur : 1024;
  const int n = static_cast<int>(std::min<rlim_t>(top, 65536));
  for (int fd = 0; fd < n; ++fd)
    if (each(fd)) return;
}

}  // namespace

int find_connection_socket(const std::string& remote_addr, int remote_port,
                           const std::string& local_addr, int local_port, const char* fd_dir) {
  int found = -1;
  for_each_descriptor(fd_dir, [&](int fd) {
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return false;
    if (!same_endpoint(addr, len, remote_addr, remote_port)) return false;
    if (local_port >= 0) {
      len = sizeof addr;
      if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return false;
      if (!same_endpoint(addr, len, local_addr, local_port)) return false;
    }
    found = fd;
    return true;
  });
  return found;
}

void end_kept_alive_connections() {
  for_each_descriptor("/proc/self/fd", [](int fd) {
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) shutdown(fd, SHUT_RD);
    return false;
  });
}

bool socket_closed(int fd) {
  pollfd p{fd, static_cast<short>(POLLIN | POLLRDHUP), 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLERR | POLLHUP | POLLNVAL | POLLRDHUP)) return true;
  char c;
  const ssize_t k = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

}  // namespace ninfer
