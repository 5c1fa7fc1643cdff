// Runs inside a sandbox on a terminal session (a tty exec): tries to reach a terminal outside it. It reports
// what its terminal is (devpts instance and device), then pushes input with TIOCSTI into every terminal it can
// get hold of: its own (allowed: that is its own input), /dev/tty, every fd it inherited, every /dev/pts entry
// it can open, and a new pty from /dev/ptmx. Prints one line: "dev D rdev R fs F injected N refused M".
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

static int inject(int fd, const char* text) {
  for (const char* p = text; *p != '\0'; ++p) {
    if (ioctl(fd, TIOCSTI, p) < 0) return -1;
  }
  return 0;
}

int main(int argc, char** argv) {
  const char* text = argc > 1 ? argv[1] : "echo injected\n";
  struct stat st;
  struct statfs fs;
  if (fstat(0, &st) < 0 || fstatfs(0, &fs) < 0) {
    printf("no terminal on fd 0\n");
    return 1;
  }
  int injected = 0, refused = 0;
  for (int fd = 0; fd < 1024; ++fd) {
    if (fcntl(fd, F_GETFD) < 0 || !isatty(fd)) continue;
    (inject(fd, text) == 0 ? injected : refused)++;
  }
  int tty = open("/dev/tty", O_RDWR | O_NOCTTY);
  if (tty >= 0) (inject(tty, text) == 0 ? injected : refused)++;
  DIR* d = opendir("/dev/pts");
  if (d != nullptr) {
    for (struct dirent* e = readdir(d); e != nullptr; e = readdir(d)) {
      if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
      char path[300];
      snprintf(path, sizeof path, "/dev/pts/%s", e->d_name);
      int fd = open(path, O_RDWR | O_NOCTTY);
      if (fd < 0) continue;
      (inject(fd, text) == 0 ? injected : refused)++;
      close(fd);
    }
    closedir(d);
  }
  printf("dev %lu rdev %lu fs %lx injected %d refused %d\n", (unsigned long)st.st_dev, (unsigned long)st.st_rdev,
         (unsigned long)fs.f_type, injected, refused);
  fflush(stdout);
  return 0;
}
