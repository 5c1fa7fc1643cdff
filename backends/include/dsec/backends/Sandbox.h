// The one interface every sandbox backend answers: the container backend and the simulated node's process-less
// sandboxes (wrappers that add to a sandbox derive from ForwardingSandbox). fncall is not a backend of its own: its
// workers are container sandboxes. The API server and the node agent never know which backend a sandbox uses
// beyond routing.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "dsec/backends/NetworkPolicy.h"
#include "dsec/common/Fd.h"
#include "dsec/common/Result.h"

namespace dsec::backends {

// kNone: a network namespace with only loopback. kEgress: its own network namespace with a route out through the
// node (never to the node itself). kHost: the host's network namespace, only for SPANK steps (their tasks are the
// job user's own unprivileged processes); container sandboxes of the node API never get it.
enum class NetworkMode { kNone, kEgress, kHost };
const char* networkModeName(NetworkMode mode);
// "none" | "egress" | "host"; kInvalidArgument otherwise.
Result<NetworkMode> parseNetworkMode(const std::string& name);

// CPU quality of service (docs/density.md). Latency sandboxes get dedicated cores (a cpuset inside one
// NUMA domain, memory bound there) at normal priority; batch sandboxes share the node's pool under
// SCHED_IDLE with a low CPU weight, so they only use what latency work leaves idle.
enum class CpuQos { kBatch, kLatency };
const char* cpuQosName(CpuQos qos);

struct SandboxSpec {
  std::string id;                          // "<node>-<hex>", also the hostname inside
  std::string image;                       // "debian:12+python:3.11", for info
  std::vector<std::string> lower_dirs;     // layer mount points, bottom first
  // The same layers' EROFS files, bottom first (machine backends attach them as read-only disks).
  std::vector<std::string> lower_files;
  int64_t memory_bytes = 0;                // 0 = unlimited
  double cpus = 0;                         // 0 = unlimited
  int64_t pids = 0;                        // 0 = unlimited
  int64_t disk_bytes = 0;                  // size of the writable upper (tmpfs); 0 = backend default
  std::map<std::string, std::string> env;  // default environment of every exec
  NetworkMode network = NetworkMode::kNone;
  // With NetworkMode::kEgress: where the sandbox may connect (no rules = nowhere; the node never).
  EgressPolicy egress;
  // Paths its processes cannot change by any route (NetworkPolicy.h); the file operations below still can.
  std::vector<std::string> protected_paths;
  CpuQos qos = CpuQos::kBatch;
  std::string cpuset_cpus;  // "2-5" (cpuset.cpus); "" = the parent's (shared pool)
  std::string cpuset_mems;  // "0" (cpuset.mems); "" = the parent's
  // No writable upper: / is the read-only layer stack and only /tmp, /dev/shm and /work are writable tmpfs
  // (fncall workers: what one call writes cannot survive outside directories the worker wipes).
  bool read_only_root = false;
  // When set, the writable upper (and overlay workdir) live in this host directory instead of a tmpfs
  // inside the sandbox, so `dsec layer build --on --run` can capture it; it must exist and be empty.
  std::string upper_dir;
};

struct ExecRequest {
  std::vector<std::string> argv;           // argv[0] looked up on the sandbox's PATH
  std::map<std::string, std::string> env;  // on top of the sandbox's env
  std::string cwd = "/";
  std::string stdin_data;
  // When >= 0, the command's stdin is this fd (e.g. the read end of a pipe the caller feeds while the
  // command runs, for streaming tar uploads) and stdin_data is ignored. The caller keeps ownership; the
  // backend dup()s it into the command and does not close the caller's copy.
  int stdin_fd = -1;
  double timeout_seconds = 0;     // 0 = none
  int64_t output_cap = 16 << 20;  // bytes kept per stream; the rest is drained and dropped
  // A terminal for the command (an interactive session): a pseudo-terminal of the sandbox's own (never one of
  // the host's) becomes its stdin, stdout and stderr and its controlling terminal. Its output comes to the sink
  // as stdout (output_cap applies); stdin_fd, when set, is read by the backend and typed into the terminal, and
  // its EOF types the terminal's end-of-file character. stdin_data is refused with a terminal.
  bool tty = false;
  int tty_rows = 24;
  int tty_cols = 80;
};

// A long-running process started inside a sandbox whose pipes the caller keeps (fncall workers). The
// process is in the sandbox's cgroup and namespaces, with the same restrictions as an exec.
struct LongRunningProcess {
  pid_t pid = -1;      // host pid
  UniqueFd pidfd;      // to wait for it / kill it without pid reuse races
  UniqueFd stdin_fd;   // write end of its stdin
  UniqueFd stdout_fd;  // read end of its stdout
  UniqueFd stderr_fd;  // read end of its stderr
};

struct ExecResult {
  int exit_code = -1;       // exit status; 128+N when killed by signal N
  int signal = 0;           // the signal that killed it, else 0
  bool timed_out = false;   // the process group was killed at the timeout
  bool truncated = false;   // some output was dropped at the cap
  bool oom_killed = false;  // the sandbox's memory cgroup OOM-killed a process during the exec
  std::string stdout_data;
  std::string stderr_data;
  double duration_seconds = 0;
};

// What a caller may do to a running exec from any thread (ExecSink::onStarted). Calls after the exec ended fail
// with kNotFound; nothing is ever signalled once the command is reaped.
class ExecControl {
 public:
  virtual ~ExecControl() = default;
  // A terminal exec's window size (the command gets SIGWINCH); kInvalidArgument without a terminal or out of range.
  virtual Status resize(int rows, int cols) = 0;
  // Sends sig to the command's process group (a terminal exec: to the terminal's foreground process group).
  virtual Status signal(int sig) = 0;
};

// Receives output as it is produced (streaming exec). Returning false stops the command (client gone).
class ExecSink {
 public:
  virtual ~ExecSink() = default;
  // The command runs (it has exec'd), before any of its output; control stays usable (and valid) while the
  // caller holds it. Returning false stops the command.
  virtual bool onStarted(const std::shared_ptr<ExecControl>& /*control*/) { return true; }
  virtual bool onStdout(const char* data, size_t size) = 0;
  virtual bool onStderr(const char* data, size_t size) = 0;
};

struct FileStat {
  std::string name;
  std::string type;  // "file", "dir", "symlink", "other"
  int64_t size = 0;
  uint32_t mode = 0;  // permission bits
  int64_t mtime = 0;  // seconds since epoch
};

enum class SandboxState { kRunning, kPaused, kStopped };

// What a snapshot holds. kFilesystem: the files the sandbox wrote (its writable upper, as a layer); processes
// and memory are not carried (containers). kMachine: memory, devices, processes and disk (microvm, vm).
enum class SnapshotKind { kFilesystem, kMachine };
const char* snapshotKindName(SnapshotKind kind);
const char* sandboxStateName(SandboxState state);

struct SandboxUsage {
  int64_t memory_bytes = 0;
  int64_t pids = 0;
  uint64_t cpu_usec = 0;
  int64_t oom_kills = 0;
};

// Every operation is pure virtual, on purpose: a default implementation is how a wrapper once dropped an
// operation without a sound (a memory limit that was never set). Wrappers derive from ForwardingSandbox
// (ForwardingSandbox.h), which forwards every operation; a new operation goes there too, and into
// tests/security/SandboxWrappersForwardTest.cc, which fails until it covers every virtual declared here.
class Sandbox {
 public:
  virtual ~Sandbox() = default;
  virtual const SandboxSpec& spec() const = 0;
  virtual SandboxState state() const = 0;
  virtual std::string backendName() const = 0;

  // Runs a command to completion with captured (capped) output.
  virtual Result<ExecResult> exec(const ExecRequest& request) = 0;
  // Runs a command and hands output to the sink as it comes; the result's stdout/stderr stay empty.
  virtual Result<ExecResult> execStream(const ExecRequest& request, ExecSink& sink) = 0;
  // True once exec/execStream honour ExecRequest::stdin_fd. Until then the API server streams tar uploads
  // through a temporary file inside the sandbox instead of a pipe.
  virtual bool supportsStdinFd() const = 0;
  // Starts argv inside the sandbox and returns at once with its pipes (ExecRequest's timeout, output_cap
  // and stdin fields are ignored); kUnsupported for backends that cannot. The process is the caller's child:
  // the caller reaps it (waitid(P_PIDFD) on the pidfd) once it has exited; destroy() kills and reaps those
  // still running (a later waitid of the caller then fails with ECHILD).
  virtual Result<LongRunningProcess> spawn(const ExecRequest& request) = 0;
  // Changes the sandbox's memory limit (0 = unlimited) while it runs (fncall sets each call's limit on its
  // worker). Lowering it below what the sandbox uses and cannot reclaim fails with kResourceExhausted; a
  // backend that cannot change it fails with kUnsupported (never succeeds without enforcing it).
  virtual Status setMemoryLimit(int64_t bytes) = 0;
  // Replaces the egress policy at once, while the sandbox runs (stages: install, then the agent's turn with
  // nothing). Connections the new policy forbids are cut, not left open. A sandbox made without a network link
  // (NetworkMode::kNone) fails with kConflict; a backend that cannot enforce it with kUnsupported.
  virtual Status setEgress(const EgressPolicy& policy) = 0;
  // Replaces the protected paths (parseProtectedPaths form) while the sandbox runs.
  virtual Status setProtectedPaths(const std::vector<std::string>& paths) = 0;
  // What its processes were refused, oldest first; a bounded record (the newest kept).
  virtual Result<std::vector<Violation>> violations() = 0;

  // Files, resolved inside the sandbox's root (symlinks cannot escape it).
  virtual Result<UniqueFd> openForRead(const std::string& path) = 0;  // a regular file
  // Creates or truncates; parent directories are created. mode e.g. 0644.
  virtual Result<UniqueFd> openForWrite(const std::string& path, uint32_t mode) = 0;
  virtual Result<FileStat> stat(const std::string& path) = 0;
  virtual Result<std::vector<FileStat>> listDir(const std::string& path) = 0;
  virtual Status remove(const std::string& path, bool recursive) = 0;

  virtual Status pause() = 0;
  virtual Status resume() = 0;
  // Pushes the sandbox's reclaimable memory out (to swap where the node has it, page cache dropped), used
  // after pausing a sandbox whose session lease lapsed. Best effort; backends without a way to do it succeed.
  virtual Status reclaimMemory() = 0;
  // Kills every process, removes mounts and cgroups, frees the upper. Idempotent.
  virtual Status destroy() = 0;
  virtual Result<SandboxUsage> usage() = 0;
  // Captures the sandbox into `dir`: an empty directory the caller made, which may be on storage other nodes
  // read. The sandbox is stopped for the capture and runs on afterwards in the state it was in. What is written
  // is the backend's own (Backend::restore reads it); the kind says what it holds.
  virtual Result<SnapshotKind> snapshot(const std::string& dir) = 0;

  // What a restarted agent needs to re-adopt this sandbox (written by the agent to its state dir).
  virtual nlohmann::json persistentState() const = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // Kernel features this backend needs that the host lacks; empty when usable.
  virtual std::vector<std::string> missingFeatures() const = 0;
  virtual Result<std::unique_ptr<Sandbox>> create(const SandboxSpec& spec) = 0;
  // A new sandbox from a snapshot directory written by a sandbox of this backend (Sandbox::snapshot), with
  // spec's id, limits and layers. kUnsupported for a backend whose snapshots the caller restores otherwise
  // (a container's is a layer the node stacks on top of the image and hands to create).
  virtual Result<std::unique_ptr<Sandbox>> restore(const SandboxSpec& spec, const std::string& dir) = 0;
  // Re-attaches to a sandbox from persistentState() after an agent restart; kNotFound if it is gone
  // (the caller then calls reap()).
  virtual Result<std::unique_ptr<Sandbox>> adopt(const nlohmann::json& state) = 0;
  // Removes whatever is left of a sandbox that cannot be adopted (processes, cgroups).
  virtual Status reap(const nlohmann::json& state) = 0;
  // Sandboxes' cgroups found on the node that the caller does not know (orphans) are reaped by id.
  virtual Result<std::vector<std::string>> listLeftovers() = 0;
  virtual Status reapLeftover(const std::string& id) = 0;
};

}  // namespace dsec::backends
