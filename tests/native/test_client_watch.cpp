// server/client_watch.h without a server: the socket of a connection is found among the
// process's descriptors by its addresses, through /proc/self/fd and, where that cannot be
// read (a root without /proc), by trying every descriptor number; a peer that closes is
// noticed, one that is idle or has sent data is not. Run by tests/test_binary.py.
//
// usage: test_client_watch
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "check.h"
#include "server/client_watch.h"

namespace {

int port_of(int fd, bool peer) {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  const int rc = peer ? getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len)
                      : getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  CHECK(rc == 0);
  return ntohs(a.sin_port);
}

}  // namespace

int main() {
  using namespace ninfer;
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  CHECK(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  CHECK(listen(listener, 4) == 0);
  const int port = port_of(listener, false);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const int client = socket(AF_INET, SOCK_STREAM, 0);
  CHECK(connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  const int served = accept(listener, nullptr, nullptr);
  CHECK(served >= 0);
  const int client_port = port_of(served, true);

  // The server's side of the connection, by the client's address and the server's.
  for (const char* dir : {"/proc/self/fd", "/nonexistent/fd"}) {
    CHECK(find_connection_socket("127.0.0.1", client_port, "127.0.0.1", port, dir) == served);
    CHECK(find_connection_socket("127.0.0.1", client_port, "", -1, dir) == served);
    CHECK(find_connection_socket("127.0.0.1", client_port + 1, "127.0.0.1", port, dir) == -1);
  }
  CHECK(!socket_closed(served));  // idle
  CHECK(write(client, "x", 1) == 1);
  usleep(10000);
  CHECK(!socket_closed(served));  // a pipelined byte waits: alive
  close(client);
  usleep(10000);
  CHECK(socket_closed(served));
  close(served);
  close(listener);
  std::printf("client watch ok\n");
  return 0;
}
