// A node's name: the prefix of its sandboxes' ids and its key in the fleet, so one rule for every place that
// takes one (dsec serve, dsec-launch, a gateway's registration).
#pragma once

#include <string>

#include "dsec/common/Result.h"

namespace dsec::launcher {

constexpr size_t kMaxNodeNameLength = 32;

// 1-32 of [a-z0-9-], not starting with '-'; the error names the rule.
Status validateNodeName(const std::string& name);

// A valid name made from any text (a host name, a Slurm node name): lower case, other characters become '-',
// leading '-' dropped, cut to 32; "node" when nothing is left.
std::string nodeNameFrom(const std::string& raw);

}  // namespace dsec::launcher
