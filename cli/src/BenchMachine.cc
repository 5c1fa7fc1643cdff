#include "BenchMachine.h"

#include <dirent.h>

#include <cstdlib>
#include <memory>

#include "dsec/common/Strings.h"

namespace dsec::cli {

Status requireNodeBackend(ApiClient& client, const std::string& backend) {
  DSEC_ASSIGN_OR_RETURN(auto node, client.call(HttpMethod::kGet, "/v1/node"));
  for (const auto& usable : node.value("backends", nlohmann::json::array())) {
    if (usable.is_string() && usable.get<std::string>() == backend) return okStatus();
  }
  std::string why = "not listed by the node";
  auto unavailable = node.value("unavailable_backends", nlohmann::json::object());
  if (unavailable.contains(backend) && unavailable[backend].is_string()) why = unavailable[backend].get<std::string>();
  return Error(ErrorCode::kUnsupported, "the node has no " + backend + " backend: " + why);
}

Result<pid_t> findSandboxQemu(const std::string& backend, const std::string& id) {
  const std::string run_dir_part = "/" + backend + "/" + id + "/";
  std::unique_ptr<DIR, int (*)(DIR*)> proc(opendir("/proc"), closedir);
  if (!proc) return Error::sys(errno, "opendir /proc");
  while (dirent* entry = readdir(proc.get())) {
    char* end = nullptr;
    long pid = std::strtol(entry->d_name, &end, 10);
    if (pid <= 0 || end == nullptr || *end != '\0') continue;
    auto cmdline = readFile(std::string("/proc/") + entry->d_name + "/cmdline");
    if (!cmdline.ok()) continue;  // gone meanwhile
    for (const auto& arg : split(*cmdline, '\0')) {
      if (arg.find("/dsec-vm/") != std::string::npos && arg.find(run_dir_part) != std::string::npos) {
        return static_cast<pid_t>(pid);
      }
    }
  }
  return Error::notFound("no QEMU names the run dir of " + backend + " sandbox " + id);
}

Result<ProcessMemory> readProcessMemory(pid_t pid) {
  DSEC_ASSIGN_OR_RETURN(std::string text, readFile("/proc/" + std::to_string(pid) + "/smaps_rollup"));
  ProcessMemory memory;
  bool seen = false;
  for (const auto& line : split(text, '\n')) {
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    int64_t bytes = std::atoll(line.c_str() + colon + 1) * 1024;  // "Rss:   1234 kB"
    if (key == "Rss") {
      memory.rss = bytes;
      seen = true;
    } else if (key == "Pss") {
      memory.pss = bytes;
    } else if (key == "Private_Clean" || key == "Private_Dirty") {
      memory.private_ += bytes;
    }
  }
  if (!seen) return Error::internal("no Rss in /proc/" + std::to_string(pid) + "/smaps_rollup");
  return memory;
}

Result<ForkAnswer> forkSandbox(ApiClient& client, const std::string& id, int count) {
  DSEC_ASSIGN_OR_RETURN(
      auto answer, client.call(HttpMethod::kPost, "/v1/sandboxes/" + percentEncode(id) + "/fork", {{"count", count}}));
  ForkAnswer fork;
  fork.snapshot = answer.value("snapshot", nlohmann::json::object()).value("name", "");
  for (const auto& info : answer.value("sandboxes", nlohmann::json::array())) fork.ids.push_back(info.value("id", ""));
  return fork;
}

Status execOk(ApiClient& client, const std::string& id, const std::vector<std::string>& cmd) {
  DSEC_ASSIGN_OR_RETURN(auto ran, client.call(HttpMethod::kPost, "/v1/sandboxes/" + percentEncode(id) + "/exec",
                                              {{"cmd", cmd}, {"timeout", 600}}));
  if (ran.value("exit_code", -1) != 0) {
    return Error::internal("exec in " + id + " exited with " + std::to_string(ran.value("exit_code", -1)) + ": " +
                           ran.value("stderr", ""));
  }
  return okStatus();
}

double toMiB(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

}  // namespace dsec::cli
