// Picks the cgroup driver for this node, and the limit conversions both drivers share.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "CgroupInternal.h"
#include "dsec/common/Cgroup.h"

namespace dsec {

using cgroup_internal::joinPath;

int64_t cpuQuotaUsec(double cpus) {
  if (!(cpus > 0)) return -1;
  double quota = std::round(cpus * static_cast<double>(kCpuPeriodUsec));
  return std::max<int64_t>(1000, static_cast<int64_t>(quota));
}

uint64_t cpuWeightToShares(uint64_t weight) {
  if (weight == 0) return 1024;
  uint64_t shares = weight * 1024 / 100;
  return std::clamp<uint64_t>(shares, 2, 262144);
}

Status validateCpusetList(const std::string& list, const std::string& field) {
  // Goes into a cgroup file verbatim: only the list syntax, so nothing else can be written there.
  size_t pos = 0;
  while (pos < list.size()) {
    size_t end = list.find(',', pos);
    if (end == std::string::npos) end = list.size();
    std::string item = list.substr(pos, end - pos);
    size_t dash = item.find('-');
    auto number = [](const std::string& s) -> long {
      if (s.empty() || s.size() > 5 || s.find_first_not_of("0123456789") != std::string::npos) return -1;
      return std::stol(s);
    };
    long lo = number(dash == std::string::npos ? item : item.substr(0, dash));
    long hi = dash == std::string::npos ? lo : number(item.substr(dash + 1));
    if (lo < 0 || hi < lo) return Error::invalid(field + " must be a list like \"0-3,8\", got \"" + list + "\"");
    pos = end + 1;
    if (end == list.size() - 1) return Error::invalid(field + " must not end with ',', got \"" + list + "\"");
  }
  return okStatus();
}

Status validateCgroupLimits(const CgroupLimits& limits) {
  if (limits.memory_bytes < 0) return Error::invalid("memory limit must not be negative");
  // cpus is a double from user input: NaN and infinities are as wrong as negatives. 4096 CPUs is far beyond any node.
  if (std::isnan(limits.cpus) || limits.cpus < 0 || limits.cpus > 4096) {
    return Error::invalid("cpus must be between 0 (unlimited) and 4096, got " + std::to_string(limits.cpus));
  }
  if (limits.pids < 0) return Error::invalid("pids limit must not be negative");
  if (limits.cpu_weight > 10000) {
    return Error::invalid("cpu weight must be between 1 and 10000, got " + std::to_string(limits.cpu_weight));
  }
  DSEC_TRY(validateCpusetList(limits.cpuset_cpus, "cpuset cpus"));
  DSEC_TRY(validateCpusetList(limits.cpuset_mems, "cpuset mems"));
  return okStatus();
}

Result<std::unique_ptr<CgroupDriver>> detectCgroupDriver(const std::string& parent, const std::string& root) {
  auto fs = makeRealCgroupFs();
  std::string v2_reason;
  // Pure v2 has cgroup.controllers at the root. A hybrid host's v2 mount (root/unified) carries no controllers
  // and is deliberately not looked at: the controllers are on v1 there.
  if (auto controllers = fs->readFile(joinPath(root, "cgroup.controllers")); controllers.ok()) {
    std::vector<std::string> missing;
    for (const char* c : {"memory", "cpu", "pids"}) {
      std::string text = " " + *controllers + " ";
      std::replace(text.begin(), text.end(), '\n', ' ');
      if (text.find(std::string(" ") + c + " ") == std::string::npos) missing.emplace_back(c);
    }
    if (missing.empty()) return makeCgroupV2Driver(std::move(fs), root, parent);
    v2_reason = "cgroup v2 at " + root + " lacks controllers:";
    for (const auto& m : missing) v2_reason += " " + m;
    return Error(ErrorCode::kUnsupported, v2_reason);
  }
  std::vector<std::string> missing;
  auto mounted = [&](const std::string& dir) { return fs->exists(joinPath(joinPath(root, dir), "cgroup.procs")); };
  if (!mounted("memory")) missing.emplace_back("memory");
  if (!mounted("cpu") && !mounted("cpu,cpuacct") && !mounted("cpuacct,cpu")) missing.emplace_back("cpu");
  if (!mounted("pids")) missing.emplace_back("pids");
  if (!mounted("freezer")) missing.emplace_back("freezer");
  if (missing.empty()) return makeCgroupV1Driver(std::move(fs), root, parent);
  std::string message =
      "no usable cgroup driver: " + root + "/cgroup.controllers is absent (not v2) and cgroup v1 lacks:";
  for (const auto& m : missing) message += " " + m;
  return Error(ErrorCode::kUnsupported, message);
}

}  // namespace dsec
