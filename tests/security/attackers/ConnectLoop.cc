// An attacker run inside a sandbox: connects to ADDR:PORT as fast as it can for SECONDS, with non-blocking sockets so
// a try costs microseconds, and prints "tries N through M errno E": M tries that the egress programs let on (any
// outcome but EPERM; E is the first such errno, 0 for a connect that completed at once). It hunts a moment in which
// an address the node closes to every sandbox is open, such as a refresh of the never-reachable set that deletes
// before it inserts. Static, so it runs in any image.
//
//   dsec-test-connect-loop ADDR PORT SECONDS
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

namespace {

double now() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s ADDR PORT SECONDS\n", argv[0]);
    return 2;
  }
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(std::atoi(argv[2])));
  if (inet_pton(AF_INET, argv[1], &to.sin_addr) != 1) return 2;
  const double end = now() + std::atof(argv[3]);
  long tries = 0, through = 0;
  int first_errno = -1;
  while (now() < end) {
    for (int i = 0; i < 256; ++i) {
      const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (fd < 0) continue;
      const int err = connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) == 0 ? 0 : errno;
      close(fd);
      ++tries;
      if (err != EPERM) {
        ++through;
        if (first_errno < 0) first_errno = err;
      }
    }
  }
  std::printf("tries %ld through %ld errno %d\n", tries, through, first_errno);
  return 0;
}
