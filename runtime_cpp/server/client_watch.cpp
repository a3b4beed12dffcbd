#include "server/client_watch.h"

#include <dirent.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

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

}  // namespace

int find_connection_socket(const std::string& remote_addr, int remote_port,
                           const std::string& local_addr, int local_port) {
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return -1;
  int found = -1;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    const int fd = std::atoi(e->d_name);
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) continue;
    if (!same_endpoint(addr, len, remote_addr, remote_port)) continue;
    if (local_port >= 0) {
      len = sizeof addr;
      if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) continue;
      if (!same_endpoint(addr, len, local_addr, local_port)) continue;
    }
    found = fd;
    break;
  }
  closedir(dir);
  return found;
}

void end_kept_alive_connections() {
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    const int fd = std::atoi(e->d_name);
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) shutdown(fd, SHUT_RD);
  }
  closedir(dir);
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
