// Shared by the benchmarks of machine sandboxes (`dsec bench create --backend microvm|vm`, `dsec bench fork`): is
// the backend usable on the node, which QEMU runs a sandbox, and what that process costs the host.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ApiClient.h"
#include "dsec/common/Result.h"

namespace dsec::cli {

// kUnsupported with the node's reason when GET /v1/node does not list `backend` among its usable backends.
Status requireNodeBackend(ApiClient& client, const std::string& backend);

// The QEMU of machine sandbox `id` of kind `backend`: the process whose command line names its run dir
// (/dev/shm/dsec-vm/<cgroup parent>/<backend>/<id>/). kNotFound if none runs.
Result<pid_t> findSandboxQemu(const std::string& backend, const std::string& id);

// From /proc/<pid>/smaps_rollup, in bytes.
struct ProcessMemory {
  int64_t rss = 0;
  int64_t pss = 0;       // shared pages divided among the processes mapping them
  int64_t private_ = 0;  // Private_Clean + Private_Dirty: pages only this process maps
};
Result<ProcessMemory> readProcessMemory(pid_t pid);

// The POST /v1/sandboxes/{id}/fork answer's sandboxes' ids and its snapshot's name.
struct ForkAnswer {
  std::string snapshot;
  std::vector<std::string> ids;
};
Result<ForkAnswer> forkSandbox(ApiClient& client, const std::string& id, int count);

// POST .../exec {"cmd": cmd} and a zero exit, else an error naming what happened.
Status execOk(ApiClient& client, const std::string& id, const std::vector<std::string>& cmd);

double toMiB(int64_t bytes);

}  // namespace dsec::cli
