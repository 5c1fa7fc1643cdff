// The node's bearer token (<root>/token) and the fleet file (~/.dsec/fleets/NAME.json) clients find it by.
#pragma once

#include <string>
#include <vector>

#include "dsec/common/Result.h"

namespace dsec::launcher {

// Reads <root>/token, or creates it (32 random bytes as hex, mode 0600) if absent. Creation is atomic
// (temp file + link), so two starting nodes agree on one token.
Result<std::string> loadOrCreateToken(const std::string& root);

// Fleet names become file names: [A-Za-z0-9._-], 1..64 chars, not starting with '.'.
Status validateFleetName(const std::string& name);
// $HOME/.dsec/fleets/<name>.json (HOME from the environment, else the passwd entry).
std::string fleetFilePath(const std::string& name);
// Writes {"endpoint","endpoints","token","fleet","node","root"} and, inside a Slurm job, "slurm_job" (the job
// that owns the fleet) atomically, dirs 0700, file 0600. "endpoints" are the gateways in the order clients try
// them; "endpoint" is the first (for readers that know one). An empty list is refused.
Status writeFleetFile(const std::string& name, const std::vector<std::string>& endpoints, const std::string& token,
                      const std::string& node, const std::string& root, const std::string& slurm_job = "");
// Removes the fleet file only if it still names `endpoint` (another node may have replaced it).
void removeFleetFileIfOurs(const std::string& name, const std::string& endpoint);

}  // namespace dsec::launcher
