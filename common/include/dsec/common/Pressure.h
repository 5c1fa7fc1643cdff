// Where the density controller's signals come from: pressure stall information (PSI: /proc/pressure/* and
// cgroup2 <dir>/{memory,cpu}.pressure), /proc/meminfo, and the sandboxes' parent cgroup (memory in use, its
// limit, the OOM kills its own limit caused, CPU time) on cgroup v1 or v2. Parsers take text so they are
// unit-tested on samples; the readers are thin wrappers over the real files.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "dsec/common/Result.h"

namespace dsec {

struct PsiLine {
  double avg10 = 0;  // percent of wall time some/all tasks stalled, 10 s moving average
  double avg60 = 0;
  double avg300 = 0;
  uint64_t total_usec = 0;  // cumulative stall time
};

struct Psi {
  PsiLine some;
  PsiLine full;  // all non-idle tasks stalled; the kernel reports 0 for cpu at the system level
  bool has_full = false;
};

// "some avg10=1.00 avg60=0.50 avg300=0.10 total=1234\nfull ..." (full is absent in older kernels' cpu file).
Result<Psi> parsePsi(std::string_view text);
Result<Psi> readPsi(const std::string& path);

struct MemInfo {
  int64_t total_bytes = 0;
  int64_t available_bytes = 0;
  int64_t free_bytes = 0;
  int64_t cached_bytes = 0;
  int64_t shmem_bytes = 0;
  int64_t swap_total_bytes = 0;
  int64_t swap_free_bytes = 0;
  int64_t used_bytes() const { return total_bytes - available_bytes; }
};

// /proc/meminfo text ("MemTotal:  24684084 kB"); MemTotal and MemAvailable are required.
Result<MemInfo> parseMemInfo(std::string_view text);
Result<MemInfo> readMemInfo(const std::string& path = "/proc/meminfo");

// The value of `key` in "key value" lines (memory.events, memory.oom_control, cpu.stat, /proc/vmstat).
std::optional<int64_t> keyedCounter(std::string_view text, std::string_view key);

// The parent cgroup every sandbox of a node lives under, read as one unit.
struct ParentCgroupStats {
  int64_t memory_bytes = 0;         // charged now (v2 memory.current, v1 memory.usage_in_bytes)
  int64_t memory_limit_bytes = 0;   // 0 = no limit
  int64_t inactive_file_bytes = 0;  // clean cache the kernel drops first (memory.stat)
  int64_t oom_kills = 0;            // kills caused by the parent's own limit (v2 memory.events.local, v1 oom_control)
  uint64_t cpu_usec = 0;            // CPU time of everything under it
  bool exists = false;              // false: no sandbox created yet, all zero
  // What the sandboxes really hold (kubelet's "working set"): a cgroup that reads files fills its limit with
  // cache, which is not pressure; PSI tells when reclaiming it starts to hurt.
  int64_t working_set_bytes() const { return std::max<int64_t>(0, memory_bytes - inactive_file_bytes); }
};

// Paths of a node's pressure sources, resolved once: on pure v2 the parent cgroup's own PSI files, on v1 and
// hybrid hosts (where sandboxes are not in a cgroup2 directory of their own) the host's /proc/pressure/*.
struct PressurePaths {
  int cgroup_version = 0;  // 1 or 2; 0 when no memory controller was found
  std::string memory_dir;  // v2: <root>/<parent>; v1: <root>/memory/<parent>
  std::string cpu_dir;     // v2: same; v1: <root>/cpuacct/<parent>
  std::string memory_psi;  // file to read PSI from
  std::string cpu_psi;
  bool psi_per_cgroup = false;  // the PSI files are the sandboxes' own, not the host's
};

PressurePaths resolvePressurePaths(const std::string& parent, const std::string& root = "/sys/fs/cgroup",
                                   const std::string& proc = "/proc");
Result<ParentCgroupStats> readParentCgroupStats(const PressurePaths& paths);

}  // namespace dsec
