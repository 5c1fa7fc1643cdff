// The sandbox's own terminals (SandboxTerminal.h).
#include "SandboxTerminal.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <linux/openat2.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>

namespace dsec::backends {

bool validTerminalSize(int rows, int cols) { return rows >= 1 && rows <= 4096 && cols >= 1 && cols <= 4096; }

Result<TerminalPair> openSandboxTerminal(int root_fd, int rows, int cols) {
  if (!validTerminalSize(rows, cols)) return Error::invalid("terminal size must be 1..4096 rows and columns");
  // Resolved inside the sandbox's root: a symlink it planted cannot lead out, and no magic link is followed.
  open_how how{};
  how.flags = O_RDWR | O_NOCTTY | O_CLOEXEC;
  how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;
  UniqueFd master(static_cast<int>(syscall(SYS_openat2, root_fd, "dev/pts/ptmx", &how, sizeof how)));
  if (!master) return Error::sys(errno, "open the sandbox's /dev/pts/ptmx");
  struct statfs fs {};
  struct stat st {};
  if (fstatfs(master.get(), &fs) < 0 || fstat(master.get(), &st) < 0)
    return Error::sys(errno, "stat the sandbox's ptmx");
  if (fs.f_type != DEVPTS_SUPER_MAGIC || !S_ISCHR(st.st_mode)) {
    return Error(ErrorCode::kConflict, "the sandbox's /dev/pts/ptmx is not a devpts ptmx; no terminal");
  }
  // The sandbox's devpts is an instance of its own; the host's never is (belt and braces: it cannot mount it).
  struct stat host {};
  if (stat("/dev/pts/ptmx", &host) == 0 && host.st_dev == st.st_dev) {
    return Error(ErrorCode::kConflict, "the sandbox's /dev/pts is the host's devpts instance; no terminal");
  }
  int unlock = 0;
  if (ioctl(master.get(), TIOCSPTLCK, &unlock) < 0) return Error::sys(errno, "unlock the sandbox's terminal");
  winsize ws{};
  ws.ws_row = static_cast<unsigned short>(rows);
  ws.ws_col = static_cast<unsigned short>(cols);
  if (ioctl(master.get(), TIOCSWINSZ, &ws) < 0) return Error::sys(errno, "set the terminal's size");
  UniqueFd slave(ioctl(master.get(), TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC));
  if (!slave) return Error::sys(errno, "open the terminal's peer (TIOCGPTPEER)");
  return TerminalPair{std::move(master), std::move(slave)};
}

}  // namespace dsec::backends
