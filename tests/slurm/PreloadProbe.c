// libdsec_preload_probe.so: what an attacker would list in /etc/ld.so.preload. Its constructor runs inside
// every dynamically linked program started afterwards, setuid ones included, and reports the effective uid it
// got there (a real attack would start a root shell instead).
#include <stdio.h>
#include <unistd.h>

__attribute__((constructor)) static void reportPrivileges(void) {
  printf("preload euid=%d\n", (int)geteuid());
  fflush(stdout);
}
