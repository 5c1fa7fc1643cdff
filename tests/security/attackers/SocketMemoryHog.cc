// An attacker run inside a sandbox: pins kernel socket memory by opening TCP connections over its own loopback and
// filling them without ever reading, until it has queued TARGET_MB or the kernel stops giving it buffer space. It
// prints "queued_mb N conns C errno E" (N: bytes queued in its sockets, which the kernel holds in socket buffers),
// then holds them until killed. The kernel's TCP memory (net.ipv4.tcp_mem) is one budget for the whole node; where
// socket buffers were not charged to the sandbox's memory cgroup, a sandbox of 64 MiB pinned hundreds of MiB of
// it, on its way to starving every TCP socket of the node. Static, so it runs in any image.
//
//   dsec-test-socket-memory-hog TARGET_MB
#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

// Bytes the kernel holds for a connection: unsent in the sender, unread in the receiver.
long queued(int sender, int receiver) {
  int out = 0, in = 0;
  if (ioctl(sender, SIOCOUTQ, &out) != 0) out = 0;
  if (ioctl(receiver, SIOCINQ, &in) != 0) in = 0;
  return static_cast<long>(out) + in;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s TARGET_MB\n", argv[0]);
    return 2;
  }
  const long target = atol(argv[1]) << 20;
  rlimit nofile{};
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0) {
    nofile.rlim_cur = nofile.rlim_max;
    setrlimit(RLIMIT_NOFILE, &nofile);
  }
  int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (listener < 0 || bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      listen(listener, 4096) != 0 || getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    printf("queued_mb 0 conns 0 errno %d\n", errno);
    return 1;
  }
  std::vector<char> chunk(1 << 20, 'x');
  std::vector<std::pair<int, int>> conns;
  long total = 0;
  int err = 0;
  int stalled = 0;  // connections in a row that took (almost) nothing: the kernel is saying no
  while (total < target && stalled < 64) {
    int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c < 0 || connect(c, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      err = errno;
      break;
    }
    int s = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (s < 0) {
      err = errno;
      break;
    }
    fcntl(c, F_SETFL, O_NONBLOCK);
    while (write(c, chunk.data(), chunk.size()) > 0) {
    }
    err = errno;
    conns.emplace_back(c, s);
    long q = queued(c, s);
    stalled = q < (64 << 10) ? stalled + 1 : 0;
    total += q;
  }
  total = 0;  // measured again: the kernel may have collapsed or pruned queues meanwhile
  for (const auto& [c, s] : conns) total += queued(c, s);
  printf("queued_mb %ld conns %zu errno %d\n", total >> 20, conns.size(), err);
  fflush(stdout);
  for (;;) pause();
}
