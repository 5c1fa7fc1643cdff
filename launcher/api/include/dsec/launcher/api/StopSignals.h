// SIGINT/SIGTERM for long-running dsec processes (dsec serve, dsec-launch), caught through a self-pipe written
// by a handler rather than sigwait() with the signals blocked: a blocked mask would be inherited by every
// sandbox process the backend starts, while handlers are reset to the default at exec.
#pragma once

#include "dsec/common/Result.h"

namespace dsec::launcher {

// Installs the handlers (idempotent).
Status installStopSignals();
// Waits up to timeout_ms (-1: for ever) for SIGINT or SIGTERM; returns the signal, or 0 if none came.
int waitForStopSignal(int timeout_ms);
// Puts back the actions found at install, so a second signal while stopping can still force the exit.
void restoreStopSignals();

}  // namespace dsec::launcher
