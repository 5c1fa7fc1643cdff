// CPU and NUMA node sets in the list format Slurm, cgroups (cpuset.cpus) and hwloc use: "0-11,96-107".
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "dsec/common/Result.h"

namespace dsec::placement {

// Sorted, de-duplicated ids -> "0-3,8,10-11" ("" for none).
std::string formatCpuList(std::vector<int> ids);
// "0-3,8,10-11" -> {0,1,2,3,8,10,11}; whitespace around items and a trailing newline (as the kernel writes
// them) are accepted; anything else is an error naming the input.
Result<std::vector<int>> parseCpuList(std::string_view text);

}  // namespace dsec::placement
