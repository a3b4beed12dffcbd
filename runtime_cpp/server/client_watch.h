// Noticing a client that went away while its request waits or prefills (nothing is
// written then, so no write can fail). Newer cpp-httplib has
// Request::is_connection_closed; older ones (0.11 in Ubuntu 22.04) do not expose the
// socket, so it is found among this process's descriptors by the request's addresses:
// the handler runs on the connection's thread, so the socket stays open meanwhile.
#pragma once

#include <functional>
#include <string>
#include <type_traits>
#include <utility>

#include <httplib.h>

#include "engine/clock.h"

namespace ninfer {

template <typename R, typename = void>
struct HasIsConnectionClosed : std::false_type {};
template <typename R>
struct HasIsConnectionClosed<R, std::void_t<decltype(std::declval<R&>().is_connection_closed)>>
    : std::true_type {};

// The socket of the connection from remote_addr:remote_port to local_addr:local_port
// among this process's descriptors (listed by `fd_dir`; without it, every descriptor
// number is tried), or -1.
int find_connection_socket(const std::string& remote_addr, int remote_port,
                           const std::string& local_addr, int local_port,
                           const char* fd_dir = "/proc/self/fd");
// True when the peer closed (or reset) the connection; data waiting to be read (a
// pipelined request) counts as alive.
bool socket_closed(int fd);
// At shutdown, once every request is answered: ends the reading side of every connected
// socket of this process, so that the HTTP threads waiting on kept-alive connections
// return at once instead of after the keep-alive timeout (cpp-httplib 0.11 checks for a
// stop only between requests). Responses still being written are not cut.
void end_kept_alive_connections();

constexpr int kPollMs = 50;  // how often a waiting handler checks its client

class ClientWatch {
 public:
  explicit ClientWatch(const httplib::Request& req) { init(req); }
  // Checks at most every kPollMs (cheap to call after every event).
  bool gone() {
    const double now = now_ms();
    if (gone_ || now - last_check_ < kPollMs) return gone_;
    last_check_ = now;
    if (probe_) {
      gone_ = probe_();
    } else {
      if (fd_ == -2)
        fd_ = find_connection_socket(remote_addr_, remote_port_, local_addr_, local_port_);
      gone_ = fd_ >= 0 && socket_closed(fd_);
    }
    return gone_;
  }

 private:
  template <typename R>
  void init(const R& req) {
    if constexpr (HasIsConnectionClosed<R>::value) {
      probe_ = req.is_connection_closed;
    } else {
      remote_addr_ = req.remote_addr;
      remote_port_ = req.remote_port;
      local_addr_ = req.local_addr;
      local_port_ = req.local_port;
    }
  }
  std::function<bool()> probe_;
  std::string remote_addr_, local_addr_;
  int remote_port_ = -1, local_port_ = -1;
  int fd_ = -2;  // -2: not looked up yet, -1: not found (never reported gone)
  double last_check_ = now_ms();
  bool gone_ = false;
};

}  // namespace ninfer
