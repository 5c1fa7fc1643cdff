// An attacker run inside a sandbox as a command (so its parent is the node's agent): clones children with
// CLONE_PARENT, which makes them the agent's children too, and lets them exit at once. The agent waits only for the
// commands it started, so they stayed zombies; the sandbox's init, which on exit waits until every process of its pid
// namespace is reaped, then never finished dying. Prints "made N errno E". Static, so it runs in any image.
//
//   dsec-test-parent-cloner COUNT
#include <sched.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

int main(int argc, char** argv) {
  const int count = argc == 2 ? atoi(argv[1]) : 16;
  int made = 0;
  int err = 0;
  for (; made < count; ++made) {
    long pid = syscall(SYS_clone, CLONE_PARENT | SIGCHLD, nullptr, nullptr, nullptr, 0);
    if (pid == 0) _exit(0);
    if (pid < 0) {
      err = errno;
      break;
    }
  }
  printf("made %d errno %d\n", made, err);
  return 0;
}
