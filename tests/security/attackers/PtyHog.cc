// An attacker run inside a sandbox: opens pseudo-terminals (/dev/ptmx) until the kernel refuses, prints
// "held N errno E", then holds them until killed. Every sandbox's devpts draws from one node-wide pool
// (kernel.pty.max less kernel.pty.reserve): when one sandbox could take it all, no other could open a terminal.
// With "try N" it only tries to open N and exits. Static, so it runs in any image.
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

int main(int argc, char** argv) {
  const bool once = argc == 3 && strcmp(argv[1], "try") == 0;
  const int want = once ? atoi(argv[2]) : 1 << 20;
  rlimit nofile{};
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0) {
    nofile.rlim_cur = nofile.rlim_max;
    setrlimit(RLIMIT_NOFILE, &nofile);
  }
  int held = 0;
  int err = 0;
  for (; held < want; ++held) {
    if (open("/dev/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC) < 0) {
      err = errno;
      break;
    }
  }
  printf("held %d errno %d\n", held, err);
  fflush(stdout);
  if (once) return 0;
  for (;;) pause();
}
