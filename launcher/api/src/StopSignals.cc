#include "dsec/launcher/api/StopSignals.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>

namespace dsec::launcher {
namespace {

int g_signal_pipe[2] = {-1, -1};
bool g_installed = false;
struct sigaction g_old_int {};
struct sigaction g_old_term {};

void onStopSignal(int sig) {
  int saved = errno;
  char c = static_cast<char>(sig);
  (void)!::write(g_signal_pipe[1], &c, 1);
  errno = saved;
}

}  // namespace

Status installStopSignals() {
  if (g_installed) return okStatus();
  if (g_signal_pipe[0] < 0 && ::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return Error::sys(errno, "pipe2");
  struct sigaction sa {};
  sa.sa_handler = onStopSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, &g_old_int);
  sigaction(SIGTERM, &sa, &g_old_term);
  g_installed = true;
  return okStatus();
}

int waitForStopSignal(int timeout_ms) {
  for (;;) {
    struct pollfd pfd = {g_signal_pipe[0], POLLIN, 0};
    int n = ::poll(&pfd, 1, timeout_ms);
    if (n < 0 && errno == EINTR) continue;
    char sig = 0;
    if (n > 0 && ::read(g_signal_pipe[0], &sig, 1) == 1) return sig;
    return 0;
  }
}

void restoreStopSignals() {
  if (!g_installed) return;
  sigaction(SIGINT, &g_old_int, nullptr);
  sigaction(SIGTERM, &g_old_term, nullptr);
  g_installed = false;
}

}  // namespace dsec::launcher
