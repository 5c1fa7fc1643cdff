// The setup protocol between the agent and dsec-sandbox-init (shared by both; plain C++ so the static init
// stays free of libstdc++).
//
// The agent starts `dsec-sandbox-init <userns=HOSTID|userns=root|nouserns> <netns|hostnet>` as a plain child in the
// host's
// namespaces (a fresh exec: nothing of the agent's memory is in it) with:
//   fd 3  a unix stream socket (agent <-> init): the handshake byte, then the config
//   fd 4  a pipe (init -> agent): status lines
//   fd 5  (userns only) the lease file of the sandbox's host id range, through a file description that holds a
//         read lock on the range's byte (UserNamespace.h): held open for the sandbox's life
// Once its root is built, PID 1 also holds fd 6: its writable upper directory (O_PATH), unless read_only_root.
//
// Stage 1 (the exec'd process, still in the host pid namespace):
//   userns: take the host uid and gid HOSTID (the root of the sandbox's range: the namespace and everything charged
//   to its owner belong to the sandbox, not to host root; "root" where the kernel refuses namespaces made by
//   unprivileged ids), unshare(CLONE_NEWUSER); write "userns\n"; wait for one byte on fd 3 (the agent has written the
//   uid and gid maps by then); become root of the namespace (setresuid/setresgid 0, no groups). Then unshare the pid,
//   uts, ipc (and with netns: net) namespaces, clone PID 1 of the sandbox with CLONE_PARENT (so it is the agent's
//   child), write "init PID\n" (its pid in the host namespace) and exit.
// Stage 2 (PID 1 of the sandbox) waits for its config: the agent moves it into the sandbox cgroup, then sends
//   text lines "key value\n", then "bpf N\n" and N raw sock_filter structs, then shuts its end down. The first
//   byte of the config carries (SCM_RIGHTS) the detached mounts of the layers, bottom first, and, when the
//   config says upper_fd, last the host directory that holds the writable upper. Keys: fail_at STEP,
//   hostname NAME, scratch DIR, lowers N, upper_fd 1, disk_bytes N, network none|egress|host,
//   egress ADDRESS GATEWAY NETMASK (network egress: eth0, which the agent made, and the default route), nameserver
//   ADDRESS (network egress: /etc/resolv.conf names only the node's resolver for sandboxes), read_only_root
//   1 (no upper: a read-only overlay with tmpfs /tmp, /work and /dev/shm of disk_bytes each, and /dev/mqueue). It
//   unshares its mount and cgroup namespaces, builds the root, and writes "ok\n" (or "err STEP ERRNO MESSAGE\n", then
//   exits) on fd 4.
// Either stage reports a failure as "err STEP ERRNO MESSAGE\n". EOF on fd 3 before the config: init exits.
#pragma once

namespace dsec::backends::init_protocol {

constexpr int kConfigFd = 3;
constexpr int kStatusFd = 4;
// Where init keeps the lease: an agent that adopts the sandbox takes a copy of it from there (pidfd_getfd).
constexpr int kLeaseFd = 5;
// Where init keeps its writable upper directory (O_PATH) when it has one: the agent's snapshots copy the upper
// from it (pidfd_getfd; after pivot_root no path reaches the upper from outside the sandbox).
constexpr int kUpperFd = 6;
constexpr int kMaxConfigBytes = 256 * 1024;
constexpr int kMaxLowers = 128;
constexpr int kMaxBpfInstructions = 4096;
// The handshake byte that tells stage 1 its id maps are written.
constexpr char kMappedByte = 'm';

// The steps init goes through, in order; "container.init.<step>" arms a failure at that step.
constexpr const char* kSteps[] = {
    "read_config", "unshare_mount", "unshare_cgroup", "make_private", "mount_upper", "mount_overlay",
    "mount_dev",   "mount_proc",    "mask_proc",      "bind_etc",     "hostname",    "loopback",
    "egress",      "pivot_root",    "seccomp",        "drop_caps",    "ready",
};
constexpr const char* kFaultPrefix = "container.init.";

}  // namespace dsec::backends::init_protocol
