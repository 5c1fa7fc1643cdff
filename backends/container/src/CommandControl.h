// The ExecControl of one running container exec (Sandbox.h): signals go to the command's process group (a
// terminal exec: the terminal's foreground group, through the kernel, so no pid is ever guessed), resizes to its
// terminal. ended() is called before the command is reaped; nothing is signalled after that.
#pragma once

#include <sys/types.h>

#include <mutex>

#include "dsec/backends/Sandbox.h"
#include "dsec/common/Fd.h"

namespace dsec::backends {

class CommandControl : public ExecControl {
 public:
  // master: a copy of the terminal's master end (invalid without a terminal); pidfd: a copy of the command's.
  CommandControl(pid_t pid, UniqueFd pidfd, UniqueFd master)
      : pid_(pid), pidfd_(std::move(pidfd)), master_(std::move(master)) {}

  Status resize(int rows, int cols) override;
  Status signal(int sig) override;
  bool terminal() const { return master_.get() >= 0; }
  // A terminal's hangup (the sandbox is about to be paused): its command's group is killed, and its leader waited
  // for (at most wait_seconds), so a freeze cannot catch it with the kill pending; true if it ran.
  bool hangUp(double wait_seconds);
  // The command exited (it is about to be reaped).
  void ended();

 private:
  std::mutex mu_;
  const pid_t pid_;
  UniqueFd pidfd_;
  UniqueFd master_;
  bool ended_ = false;
};

}  // namespace dsec::backends
