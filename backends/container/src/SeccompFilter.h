// The seccomp filter of every sandbox process, built once per backend with libseccomp and exported as raw
// BPF so that a forked child (async-signal-safe only) can install it with a single prctl.
#pragma once

// buildSandboxSeccompFilter() (declared in the public SandboxPolicy.h) allows everything except what a sandbox never
// needs (module loading, kexec, mounts, bpf, perf, keyrings, namespaces, ...): those fail with EPERM; clone3 fails
// with ENOSYS so libc falls back to clone, whose namespace flags are checked.
#include "dsec/backends/container/SandboxPolicy.h"
