// Terminals for interactive execs: a pseudo-terminal pair of the sandbox's own devpts instance (mounted by its
// init at /dev/pts), never one of the host's. The agent opens the sandbox's ptmx through the sandbox's root and
// takes the other end with TIOCGPTPEER (no path lookup a process inside could redirect), so what the command
// holds is a terminal the sandbox already had access to: it can inject input only into itself.
#pragma once

#include "dsec/common/Fd.h"
#include "dsec/common/Result.h"

namespace dsec::backends {

struct TerminalPair {
  UniqueFd master;  // the agent's end (O_NONBLOCK is the caller's to set)
  UniqueFd slave;   // the command's stdin, stdout and stderr
};

// Opens a new terminal in the devpts instance under root_fd (the sandbox's root, O_PATH) with the given window
// size. Refused (kConflict) when what the sandbox's /dev/pts/ptmx leads to is not a devpts ptmx or is the
// host's own devpts instance.
Result<TerminalPair> openSandboxTerminal(int root_fd, int rows, int cols);

// Whether rows and cols make a window size a terminal takes (1..4096 each).
bool validTerminalSize(int rows, int cols);

}  // namespace dsec::backends
