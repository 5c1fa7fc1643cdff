// Signals and window changes for a running container exec (CommandControl.h).
#include "CommandControl.h"

#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <termios.h>

#include <cerrno>

#include "SandboxTerminal.h"

namespace dsec::backends {

Status CommandControl::resize(int rows, int cols) {
  if (!validTerminalSize(rows, cols)) return Error::invalid("terminal size must be 1..4096 rows and columns");
  std::lock_guard lock(mu_);
  if (ended_) return Error::notFound("the command has exited");
  if (!master_) return Error::invalid("the exec has no terminal to resize");
  winsize ws{};
  ws.ws_row = static_cast<unsigned short>(rows);
  ws.ws_col = static_cast<unsigned short>(cols);
  if (ioctl(master_.get(), TIOCSWINSZ, &ws) < 0) return Error::sys(errno, "resize the terminal");
  return okStatus();
}

Status CommandControl::signal(int sig) {
  if (sig <= 0 || sig >= NSIG) return Error::invalid("no signal " + std::to_string(sig));
  std::lock_guard lock(mu_);
  if (ended_) return Error::notFound("the command has exited");
  // The keys' own signals go to the terminal's foreground group the way ^C does (the kernel picks the group).
  if (master_ && (sig == SIGINT || sig == SIGQUIT || sig == SIGTSTP)) {
    if (ioctl(master_.get(), TIOCSIG, sig) == 0) return okStatus();
  }
  // Its session's leader is not reaped yet (ended() comes first), so the group id names the command's group.
  if (kill(-pid_, sig) < 0 && errno != ESRCH) return Error::sys(errno, "signal the command");
  return okStatus();
}

bool CommandControl::hangUp(double wait_seconds) {
  {
    std::lock_guard lock(mu_);
    if (ended_) return false;
    kill(-pid_, SIGKILL);
  }
  // The pidfd stays valid (ours) whether or not the pump reaps meanwhile: readable once the leader exited.
  pollfd p{pidfd_.get(), POLLIN, 0};
  (void)poll(&p, 1, static_cast<int>(wait_seconds * 1000));
  return true;
}

void CommandControl::ended() {
  std::lock_guard lock(mu_);
  ended_ = true;
  master_.reset();
}

}  // namespace dsec::backends
