// The setup protocol between the agent and dsec-sandbox-init (shared by both; plain C++ so the static init
// stays free of libstdc++).
//
// fd 3 (agent -> init): text lines "key value\n", then "bpf N\n" followed by N raw sock_filter structs,
// then EOF. Keys: fail_at STEP, hostname NAME, scratch DIR, lower DIR (repeated, bottom first), upper_dir DIR,
// disk_bytes N, network none|host, read_only_root 1 (no upper: a read-only overlay with tmpfs /tmp, /work and
// /dev/shm of disk_bytes each, and /dev/mqueue), cgroup FILE (repeated: a cgroup `tasks`/`cgroup.procs` file init
// writes "0" into to join the sandbox cgroup before anything else). init starts in the host mount namespace (it may
// wait in a pool for its config, and must then see the layers mounted meanwhile) and unshares its own once the config
// is in. fd 4 (init -> agent): "ok\n" once the root is ready, or "err STEP ERRNO MESSAGE\n" (then init exits).
#pragma once

namespace dsec::backends::init_protocol {

constexpr int kConfigFd = 3;
constexpr int kStatusFd = 4;
constexpr int kMaxConfigBytes = 256 * 1024;
constexpr int kMaxLowers = 128;
constexpr int kMaxCgroupFiles = 16;
constexpr int kMaxBpfInstructions = 4096;

// The steps init goes through, in order; "container.init.<step>" arms a failure at that step.
constexpr const char* kSteps[] = {
    "read_config",   "join_cgroup", "unshare_mount", "unshare_cgroup", "make_private", "mount_upper",
    "mount_overlay", "mount_dev",   "mount_proc",    "mask_proc",      "bind_etc",     "hostname",
    "loopback",      "pivot_root",  "seccomp",       "drop_caps",      "ready",
};
constexpr const char* kFaultPrefix = "container.init.";

}  // namespace dsec::backends::init_protocol
