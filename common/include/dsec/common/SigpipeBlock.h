// Keeps SIGPIPE from killing the process while this thread writes to a pipe whose reader may be gone (a
// command's stdin, a zygote's request pipe): the write fails with EPIPE instead. Any SIGPIPE raised
// meanwhile is consumed before the thread's old mask comes back.
#pragma once

#include <signal.h>

#include <ctime>

namespace dsec {

class SigpipeBlock {
 public:
  SigpipeBlock() {
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &s, &old_);
  }
  ~SigpipeBlock() {
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGPIPE);
    timespec zero{0, 0};
    while (sigtimedwait(&s, nullptr, &zero) > 0) {
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SigpipeBlock(const SigpipeBlock&) = delete;
  SigpipeBlock& operator=(const SigpipeBlock&) = delete;

 private:
  sigset_t old_;
};

}  // namespace dsec
