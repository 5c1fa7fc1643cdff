// What `dsec bench density` measures of memory: the image's layer pages in the page cache, the Rss and Pss of
// the sandboxes' processes, and a memory limit on the node's cgroup parent for the run.
#pragma once

#include <cstdint>
#include <string>

namespace dsec::cli {

// Bytes of the image's layer files resident in the page cache, each page counted once whoever faulted it in.
int64_t imageResidentBytes(const std::string& root, const std::string& image);

// Rss and Pss of every process in the node's sandboxes (their cgroups under the node's parent).
struct ProcessMemory {
  double rss_file = 0, rss_anon = 0, pss_file = 0, pss_anon = 0;  // bytes
  int processes = 0;
};
ProcessMemory sandboxProcessMemory(const std::string& parent);

// Limits the node's parent cgroup (the bench never needs more than its capacity plus headroom), so a run
// cannot eat the host. Returns the directory to remove afterwards, or "".
std::string limitParent(const std::string& root, int64_t bytes);

}  // namespace dsec::cli
