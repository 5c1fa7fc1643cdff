// The protocol between the agent and dsec-sandbox-spawner (shared by both; plain C++ so the static spawner stays
// free of libstdc++).
//
// The spawner is a fresh exec of a small static program, so nothing of the agent's memory (tokens, other requests)
// is in it; it is undumpable, and it lives in the host's namespaces, where no sandbox can see it. It starts every
// command that runs inside a sandbox: for each request it enters the sandbox's namespaces but the user namespace
// (pid for children, mount, network, uts, ipc, cgroup: one setns through the init's pidfd), clones a child with
// CLONE_PARENT (the agent's child, so the agent waits for it and reads its exit status), returns to its own
// namespaces and answers with the child's pid at once, without waiting for it. The child is visible inside from the
// clone on, and some /proc files of a visible process need no ptrace access (net/*, mountinfo): born in the
// sandbox's namespaces, it shows only the sandbox's. It joins the cgroup, then the sandbox's user namespace, becomes
// the sandbox's root, drops to the sandbox's capabilities, no_new_privs and seccomp filter, and execs. Until it is
// in the sandbox's user namespace it is host root, out of reach of everything inside; from then on it holds only a
// copy of the spawner's memory, undumpable, and a process inside that stops it delays only that command (the
// agent's timeouts still apply).
//
// fd 3 of the spawner is a unix stream socket to the agent.
//   agent -> spawner, once: SetupHeader, then the seccomp filter (sock_filter[bpf_len]).
//   agent -> spawner, per command: RequestHeader (carrying, SCM_RIGHTS, the fds listed below), then the strings:
//     argc argv strings, envc "K=V" strings, ncandidates paths to try for argv[0], then cwd, each NUL-terminated.
//     fds, in order: init pidfd, stdin, stdout, stderr, the write end of the status pipe, then nprocs fds of the
//     sandbox cgroup's procs/tasks files opened for writing.
//   agent -> spawner, per sandbox init (Spawn.h, spawnInitStage): a RequestHeader with kInitRequestMagic carrying
//     init_fds fds, which become fds 0..init_fds-1 of the program, then the strings as for a command (argv, no env,
//     one candidate: the program's path, cwd "/"). The spawner clones a child with CLONE_PARENT in its own (the
//     host's) namespaces, which execs the program with every signal blocked. The agent could start it itself, but
//     a clone copies the caller's fd table, and a node agent holds thousands of fds: starting every init from the
//     spawner's few keeps the cost of a create from growing with the sandboxes on the node.
//   spawner -> agent, per command or init: Reply.
//   child -> agent: on the status pipe, a ChildFailure and exit 127 when a step fails; on success the pipe just
//   closes at exec (it is close-on-exec).
#pragma once

#include <stdint.h>

namespace dsec::backends::spawn_protocol {

constexpr int kChannelFd = 3;
constexpr uint32_t kSetupMagic = 0x64737031;        // "dsp1"
constexpr uint32_t kRequestMagic = 0x64737271;      // "dsrq"
constexpr uint32_t kInitRequestMagic = 0x6473696e;  // "dsin"
constexpr uint32_t kMaxStringBytes = 4u << 20;      // argv + env + paths (ARG_MAX-sized)
constexpr uint32_t kMaxProcsFds = 8;
constexpr uint32_t kFixedFds = 5;  // init pidfd, stdin, stdout, stderr, status
constexpr uint32_t kMaxBpfInstructions = 4096;

struct SetupHeader {
  uint32_t magic;
  uint32_t bpf_len;
};

enum RequestFlags : uint32_t {
  kUserNamespace = 1,   // join the sandbox's user namespace and become its root
  kControllingTty = 2,  // stdin is a terminal (the sandbox's own): make it the new session's controlling terminal
};

struct RequestHeader {
  uint32_t magic;
  uint32_t flags;
  int32_t namespace_flags;  // CLONE_NEW* the child is born in besides the pid namespace (never CLONE_NEWUSER)
  int32_t sched_policy;     // -1: keep
  uint64_t keep_caps;
  uint32_t argc, envc, ncandidates;
  uint32_t nprocs;
  uint32_t string_bytes;  // the NUL-terminated strings that follow
  uint32_t init_fds;      // kInitRequestMagic: the fds that came (0 for a command)
};

struct Reply {
  int32_t pid;  // > 0: the child, the agent's to wait for; else -err
  int32_t err;
};

// Steps a child can fail at (before exec).
enum ChildStep : int32_t {
  kStepNone = 0,
  kStepFds,
  kStepCgroup,
  kStepSetns,
  kStepIds,
  kStepSetsid,
  kStepChdir,
  kStepSched,
  kStepCaps,
  kStepNoNewPrivs,
  kStepSeccomp,
  kStepExec,
  kStepTty,
};

struct ChildFailure {
  int32_t step;
  int32_t err;
};

inline const char* childStepName(int32_t step) {
  switch (step) {
    case kStepFds:
      return "set up fds";
    case kStepCgroup:
      return "join cgroup";
    case kStepSetns:
      return "setns into sandbox";
    case kStepIds:
      return "become the sandbox's root";
    case kStepSetsid:
      return "setsid";
    case kStepChdir:
      return "chdir";
    case kStepSched:
      return "set scheduling policy";
    case kStepCaps:
      return "drop capabilities";
    case kStepNoNewPrivs:
      return "no_new_privs";
    case kStepSeccomp:
      return "install seccomp filter";
    case kStepExec:
      return "exec";
    case kStepTty:
      return "take the terminal";
    default:
      return "unknown step";
  }
}

}  // namespace dsec::backends::spawn_protocol
