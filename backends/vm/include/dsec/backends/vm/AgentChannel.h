// The node's side of dsec-guest-agent, the guest's PID 1 in microvm and vm sandboxes. The agent serves requests
// on the VM's virtio-serial ports (named "dsec.0" .. "dsec.<kAgentPorts-1>"); each port carries one request at a
// time, so a request takes a free port, and waits for one (until its deadline) when all are busy. The guest is
// hostile: everything it sends is bounded and checked, and no answer is waited for past a deadline.
//
// Ports are unix sockets QEMU listens on (one chardev per port). A channel is made again over the same sockets
// after an agent restart (re-adoption) and over a restored VM's new ones: its hello makes the agent drop whatever
// an earlier peer left half done on that port.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dsec/backends/Sandbox.h"
#include "dsec/common/Fd.h"
#include "dsec/common/Result.h"

namespace dsec::backends::vm {

// At most 15 on q35: at boot QEMU queues each port's add, then its name and (host connected) open, on the guest's
// 32-entry control queue faster than the guest refills it; the 16th port's open is dropped and the guest never
// writes to it (its bytes to the guest still arrive, so the agent sees a hello it cannot answer). 12 keeps a margin.
inline constexpr int kAgentPorts = 12;

// What the agent does once after boot: layers are the VM's read-only disks in attachment order (bottom first);
// the root is an overlay of them under a tmpfs upper of upper_bytes.
struct GuestSetup {
  std::string hostname;
  int layer_disks = 0;
  int64_t upper_bytes = 0;  // 0: half the guest's memory
  int64_t pids = 0;         // 0: unlimited (else a guest cgroup holds every command)
  std::map<std::string, std::string> env;
  // The image's init to hand PID 1 to once the root is ready ("" : the agent stays PID 1). The guest answers the
  // setup only when the agent runs again beside it.
  std::string init;
};

// What a restored (or forked) copy changes before it runs anything: it is a new machine.
struct GuestRestored {
  std::string hostname;
  double wall_clock_unix = 0;  // the host's time
  std::string entropy;         // 64 random bytes to mix into the guest's pool
};

struct GuestUsage {
  int64_t memory_used_bytes = 0;  // MemTotal - MemAvailable
  int64_t pids = 0;               // processes of the sandbox (commands and what they started)
};

class AgentChannel {
 public:
  // `ports` are connected sockets to the port chardevs, port i = "dsec.i". Sends hello on each and waits for the
  // answers until timeout_seconds (a booting guest answers once its agent runs). kTimeout naming the port
  // that did not answer.
  static Result<std::unique_ptr<AgentChannel>> connect(std::vector<UniqueFd> ports, double timeout_seconds);
  virtual ~AgentChannel() = default;

  virtual Status setup(const GuestSetup& setup, double timeout_seconds) = 0;
  virtual Status restored(const GuestRestored& restored, double timeout_seconds) = 0;

  // ExecRequest semantics as Sandbox::exec/execStream (stdin data or fd, timeout, output cap, tty, signals
  // through ExecControl). sink == nullptr: output captured in the result.
  virtual Result<ExecResult> exec(const ExecRequest& request, ExecSink* sink) = 0;

  // Files inside the sandbox's root. readFile writes the file's bytes to out_fd; writeFile creates or truncates
  // (parents created) with mode and fills it from in_fd until EOF.
  virtual Status readFile(const std::string& path, int out_fd) = 0;
  virtual Status writeFile(const std::string& path, uint32_t mode, int in_fd) = 0;
  virtual Result<FileStat> stat(const std::string& path) = 0;
  virtual Result<std::vector<FileStat>> listDir(const std::string& path) = 0;
  virtual Status remove(const std::string& path, bool recursive) = 0;

  virtual Result<GuestUsage> usage() = 0;
  // Drops the guest's page cache and compacts, so free page reporting hands the pages back to the host.
  virtual Status reclaim() = 0;

  // Fails every request in flight and every later one with kUnavailable (the VM is going away).
  virtual void close() = 0;
};

}  // namespace dsec::backends::vm
