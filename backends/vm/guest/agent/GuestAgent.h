// dsec-guest-agent: PID 1 of microvm and vm sandboxes (docs/vm-guest.md). One thread serves each virtio-serial port
// "dsec.N", one request at a time; the main thread reaps every process the guest's orphans leave to PID 1.
#pragma once

#include <sys/types.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "AgentProtocol.h"

namespace dsec::guest {

namespace proto = dsec::vm::protocol;

// Where the sandbox lives inside the guest (the initramfs root is the agent's own).
inline constexpr const char* kSandboxRoot = "/sandbox";
inline constexpr const char* kSandboxCgroup = "/sys/fs/cgroup/sandbox";

void logLine(const std::string& line);

// One port's byte stream: frames in through a parser, frames out with blocking writes. A hangup (the host side
// closed its socket) shows as kHangup; the next peer starts with a hello.
class Port {
 public:
  Port(int fd, std::string name) : fd_(fd), name_(std::move(name)) {}
  enum class Read { kFrame, kNone, kHangup, kBad };
  // Reads what the port has (waiting up to timeout_ms; -1 forever) until a frame is complete.
  Read read(proto::Frame* out, int timeout_ms);
  // Pulls whatever is readable now into the parser; false on hangup. Then nextFrame() hands out complete frames.
  bool pump();
  Read nextFrame(proto::Frame* out);
  bool send(proto::FrameType type, uint32_t request, std::string_view payload);
  // Raw bytes split into frames of at most kMaxChunk.
  bool sendChunks(proto::FrameType type, uint32_t request, const char* data, size_t size);
  bool sendError(uint32_t request, int err, const std::string& message);
  void resetStream() { parser_ = proto::FrameParser(); }
  int fd() const { return fd_; }
  const std::string& name() const { return name_; }

 private:
  int fd_;
  std::string name_;
  proto::FrameParser parser_;
};

// Processes the agent started for requests: the reaper (main thread) hands their exit status to the request that
// waits for it, through an eventfd the request polls.
class Reaper {
 public:
  static Reaper& instance();
  // fork() with the lock held, so the reaper cannot miss the registration of a child that exits at once.
  // Returns the pid (0 in the child, -1 on error) and the eventfd (parent only) signalled at its exit.
  pid_t forkTracked(int* exit_event_fd);
  // The status of a tracked child once its event fired; forgets it.
  int takeStatus(pid_t pid);
  // Main thread: reaps every exited child (orphans included).
  void reapAll();

 private:
  struct Tracked {
    int event_fd = -1;
    bool exited = false;
    int status = 0;
  };
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<pid_t, Tracked> tracked_;
};

// The sandbox inside the guest, made once by setup.
struct SandboxState {
  std::mutex mu;
  bool ready = false;
  int root_fd = -1;  // O_PATH of kSandboxRoot once set up
  std::string hostname;
  std::map<std::string, std::string> env;
};
SandboxState& sandbox();

// Request handlers. A handler that reads further frames (exec, writeFile) stops at a hello and leaves it in
// `pending` for the port loop; at a hangup it abandons the request.
void handleSetup(Port& port, const proto::Frame& frame);
void handleRestored(Port& port, const proto::Frame& frame);
void handleUsage(Port& port, const proto::Frame& frame);
void handleReclaim(Port& port, const proto::Frame& frame);
void handleExec(Port& port, const proto::Frame& frame, std::optional<proto::Frame>* pending);
void handleReadFile(Port& port, const proto::Frame& frame);
void handleWriteFile(Port& port, const proto::Frame& frame, std::optional<proto::Frame>* pending);
void handleStat(Port& port, const proto::Frame& frame);
void handleListDir(Port& port, const proto::Frame& frame);
void handleRemove(Port& port, const proto::Frame& frame);

// The image's init as PID 1 (GuestHandoff.cc). handOffInit runs in PID 1 after setup: it returns only on failure,
// with why. The agent re-exec'd beside the init calls resumeAfterInit with the inherited root fd, then
// answerHandoff on each port it opens (the one the setup came on gets its answer).
std::string handOffInit(Port& port, uint32_t request, const proto::SetupMsg& setup);
bool resumeAfterInit(int root_fd);
void answerHandoff(Port& port);

}  // namespace dsec::guest
