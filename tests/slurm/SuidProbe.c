// dsec-suid-probe: installed setuid root in the Slurm tests' image (layer testsuid:1, see slurm_fixture.sh).
// Dynamically linked on purpose, so the loader honours /etc/ld.so.preload for it, as for any setuid program.
// Prints the identities it runs with: an effective uid 0 for an unprivileged caller means the setuid bit
// worked inside a step sandbox, which it must not.
#include <stdio.h>
#include <unistd.h>

int main(void) {
  printf("probe ruid=%d euid=%d\n", (int)getuid(), (int)geteuid());
  return 0;
}
