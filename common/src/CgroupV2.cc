// cgroup v2: one unified tree; a sandbox is root/<parent>/<name>. The controllers a sandbox needs are switched on
// in cgroup.subtree_control of every ancestor down to <parent>, which must itself hold no processes (the v2
// "no internal processes" rule) - it never does, it only holds sandbox cgroups.
#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <memory>
#include <mutex>

#include "CgroupInternal.h"
#include "dsec/common/Cgroup.h"
#include "dsec/common/Logging.h"

namespace dsec {
namespace {

using namespace cgroup_internal;

constexpr const char* kWantedControllers[] = {"memory", "cpu", "pids"};
// Enabled where the root offers it, but never required: a delegated subtree without cpuset still runs sandboxes
// (only CPU pinning is refused, with an error saying why).
constexpr const char* kOptionalControllers[] = {"cpuset"};

std::vector<std::string> words(std::string_view text) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < text.size()) {
    while (pos < text.size() && (text[pos] == ' ' || text[pos] == '\n')) ++pos;
    size_t end = pos;
    while (end < text.size() && text[end] != ' ' && text[end] != '\n') ++end;
    if (end > pos) out.emplace_back(text.substr(pos, end - pos));
    pos = end;
  }
  return out;
}

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

struct V2Layout {
  std::string root;
  std::string parent;
  std::vector<std::string> controllers;  // of kWantedControllers, those the root offers
  std::vector<std::string> optional;     // of kOptionalControllers, those the root offers
};

class CgroupV2 final : public Cgroup {
 public:
  CgroupV2(std::shared_ptr<CgroupFs> fs, std::shared_ptr<const V2Layout> layout, std::string name)
      : fs_(std::move(fs)),
        layout_(std::move(layout)),
        name_(std::move(name)),
        dir_(joinPath(joinPath(layout_->root, layout_->parent), name_)) {}

  const std::string& name() const override { return name_; }
  const std::string& dir() const { return dir_; }
  std::string file(const char* leaf) const { return joinPath(dir_, leaf); }

  Status attach(pid_t pid) override {
    Status s = fs_->writeFile(file("cgroup.procs"), std::to_string(pid));
    if (!s.ok()) return s.error().wrap("attaching " + std::to_string(pid) + " to cgroup " + name_);
    return okStatus();
  }

  std::vector<std::string> procsFiles() const override { return {file("cgroup.procs")}; }
  std::string cloneIntoPath() const override { return dir_; }

  Status setLimits(const CgroupLimits& limits) override { return applyLimits(limits, /*fresh=*/false); }

  Status applyLimits(const CgroupLimits& limits, bool fresh) {
    DSEC_TRY(validateCgroupLimits(limits));
    if (limits.memory_bytes > 0 || !fresh) {
      DSEC_TRY(write("memory.max", limits.memory_bytes > 0 ? std::to_string(limits.memory_bytes) : "max"));
    }
    if (limits.cpus > 0 || !fresh) {
      int64_t quota = cpuQuotaUsec(limits.cpus);
      std::string value =
          (quota < 0 ? std::string("max") : std::to_string(quota)) + " " + std::to_string(kCpuPeriodUsec);
      DSEC_TRY(write("cpu.max", value));
    }
    // The kernel refuses cpu.weight (EINVAL) while cpu.idle is 1: idle off first, weight, then idle on.
    const bool has_idle = fs_->exists(file("cpu.idle"));
    if (has_idle && !fresh) DSEC_TRY(write("cpu.idle", "0"));
    if (limits.cpu_weight > 0 || !fresh) {
      DSEC_TRY(write("cpu.weight", std::to_string(limits.cpu_weight > 0 ? limits.cpu_weight : 100)));
    }
    if (has_idle && limits.cpu_idle) DSEC_TRY(write("cpu.idle", "1"));
    if (limits.pids > 0 || !fresh) {
      DSEC_TRY(write("pids.max", limits.pids > 0 ? std::to_string(limits.pids) : "max"));
    }
    // v2 cpusets inherit: an empty cpuset.cpus means the parent's, so only given values (or a reset) are written.
    if (!fresh && hasCpuset()) {
      DSEC_TRY(write("cpuset.mems", limits.cpuset_mems));
      DSEC_TRY(write("cpuset.cpus", limits.cpuset_cpus));
      return okStatus();
    }
    return setCpuset(limits.cpuset_cpus, limits.cpuset_mems);
  }

  bool hasCpuset() { return fs_->exists(file("cpuset.cpus")); }

  Status setCpuset(const std::string& cpus, const std::string& mems) override {
    DSEC_TRY(validateCpusetList(cpus, "cpuset cpus"));
    DSEC_TRY(validateCpusetList(mems, "cpuset mems"));
    if (cpus.empty() && mems.empty()) return okStatus();
    if (!hasCpuset()) {
      return Error(ErrorCode::kUnsupported,
                   "cgroup " + name_ + ": the cpuset controller is not enabled in " +
                       joinPath(joinPath(layout_->root, layout_->parent), "cgroup.subtree_control") +
                       " (the root does not offer it or it could not be enabled): cannot pin CPUs");
    }
    if (!mems.empty()) DSEC_TRY(write("cpuset.mems", mems));
    if (!cpus.empty()) DSEC_TRY(write("cpuset.cpus", cpus));
    return okStatus();
  }

  Status freeze() override {
    DSEC_TRY(write("cgroup.freeze", "1"));
    Status waited = waitEvent("frozen", 1, kFreezeTimeoutSeconds);
    if (!waited.ok()) {
      (void)fs_->writeFile(file("cgroup.freeze"), "0");  // never leave a half-frozen cgroup behind a failed pause
      return waited.error().wrap("freezing cgroup " + name_);
    }
    return okStatus();
  }

  Status thaw() override {
    DSEC_TRY(write("cgroup.freeze", "0"));
    Status waited = waitEvent("frozen", 0, kFreezeTimeoutSeconds);
    if (!waited.ok()) return waited.error().wrap("thawing cgroup " + name_);
    return okStatus();
  }

  Result<CgroupStats> stats() override {
    CgroupStats st;
    // Files of a controller that is not enabled are simply absent: their figures stay 0.
    DSEC_ASSIGN_OR_RETURN(st.memory_current, readIntIfPresent("memory.current"));
    DSEC_ASSIGN_OR_RETURN(st.memory_peak, readIntIfPresent("memory.peak"));
    DSEC_ASSIGN_OR_RETURN(st.oom_kills, keyedIfPresent("memory.events", "oom_kill"));
    DSEC_ASSIGN_OR_RETURN(st.pids_current, readIntIfPresent("pids.current"));
    DSEC_ASSIGN_OR_RETURN(int64_t usage, keyedIfPresent("cpu.stat", "usage_usec"));
    st.cpu_usage_usec = static_cast<uint64_t>(usage);
    DSEC_ASSIGN_OR_RETURN(int64_t frozen, keyedIfPresent("cgroup.events", "frozen"));
    st.frozen = frozen == 1;
    return st;
  }

  Result<std::vector<pid_t>> pids() override {
    DSEC_ASSIGN_OR_RETURN(std::string text, fs_->readFile(file("cgroup.procs")));
    return parsePids(text);
  }

  Status reclaim() override {
    if (!fs_->exists(file("memory.reclaim"))) {
      return Error(ErrorCode::kUnsupported, "memory.reclaim not available (Linux < 5.19 or memory controller off)");
    }
    DSEC_ASSIGN_OR_RETURN(int64_t current, readIntIfPresent("memory.current"));
    if (current <= 0) return okStatus();
    Status s = fs_->writeFile(file("memory.reclaim"), std::to_string(current));
    // EAGAIN: the kernel reclaimed less than asked, which is expected when asking for everything.
    if (!s.ok() && s.error().sysErrno() != EAGAIN) return s.error().wrap("reclaiming memory of cgroup " + name_);
    return okStatus();
  }

  Status killAll() override {
    if (fs_->exists(file("cgroup.kill"))) {
      DSEC_TRY(write("cgroup.kill", "1"));
    } else {
      // Before Linux 5.14: freeze (no forks), kill what is listed, thaw so the kills land.
      Status frozen = freeze();
      if (!frozen.ok()) DSEC_LOG(kWarn, "cgroup") << "killAll " << name_ << ": " << frozen.error().message();
      DSEC_ASSIGN_OR_RETURN(auto list, pids());
      for (pid_t pid : list) DSEC_TRY(fs_->signalProcess(pid, SIGKILL));
      DSEC_TRY(thaw());
    }
    return pollUntil(
        [&]() -> Result<bool> {
          // "populated 0" covers descendant cgroups too; fall back to cgroup.procs if events is unreadable.
          auto events = fs_->readFile(file("cgroup.events"));
          if (events.ok()) {
            if (auto populated = keyedValue(*events, "populated")) return *populated == 0;
          }
          DSEC_ASSIGN_OR_RETURN(auto left, pids());
          return left.empty();
        },
        kKillTimeoutSeconds, "waiting for cgroup " + name_ + " to empty");
  }

  Status remove() override {
    Status s = removeDirsPatiently(*fs_, {dir_});
    if (!s.ok()) return s.error().wrap("removing cgroup " + name_);
    return okStatus();
  }

 private:
  Status write(const char* leaf, const std::string& value) {
    Status s = fs_->writeFile(file(leaf), value);
    if (!s.ok()) return s.error().wrap("cgroup " + name_ + ": setting " + leaf);
    return okStatus();
  }

  Result<int64_t> readIntIfPresent(const char* leaf) {
    std::string path = file(leaf);
    if (!fs_->exists(path)) return int64_t{0};
    DSEC_ASSIGN_OR_RETURN(std::string text, fs_->readFile(path));
    auto v = parseInt64(text);
    if (!v) return Error::internal("unexpected contents of " + path + ": '" + text + "'");
    return *v;
  }

  Result<int64_t> keyedIfPresent(const char* leaf, const char* key) {
    std::string path = file(leaf);
    if (!fs_->exists(path)) return int64_t{0};
    DSEC_ASSIGN_OR_RETURN(std::string text, fs_->readFile(path));
    return keyedValue(text, key).value_or(0);
  }

  Status waitEvent(const char* key, int64_t want, double timeout) {
    std::string path = file("cgroup.events");
    return pollUntil(
        [&]() -> Result<bool> {
          DSEC_ASSIGN_OR_RETURN(std::string text, fs_->readFile(path));
          return keyedValue(text, key) == want;
        },
        timeout, "waiting for '" + std::string(key) + " " + std::to_string(want) + "' in " + path);
  }

  std::shared_ptr<CgroupFs> fs_;
  std::shared_ptr<const V2Layout> layout_;
  std::string name_;
  std::string dir_;
};

class CgroupV2Driver final : public CgroupDriver {
 public:
  CgroupV2Driver(std::shared_ptr<CgroupFs> fs, const std::string& root, const std::string& parent)
      : fs_(std::move(fs)) {
    auto layout = std::make_shared<V2Layout>();
    layout->root = root;
    layout->parent = parent;
    auto offered = fs_->readFile(joinPath(root, "cgroup.controllers"));
    if (offered.ok()) {
      auto have = words(*offered);
      for (const char* c : kWantedControllers) {
        if (contains(have, c)) layout->controllers.emplace_back(c);
      }
      for (const char* c : kOptionalControllers) {
        if (contains(have, c)) layout->optional.emplace_back(c);
      }
    }
    layout_ = std::move(layout);
  }

  int version() const override { return 2; }

  Result<std::unique_ptr<Cgroup>> create(const std::string& name, const CgroupLimits& limits) override {
    DSEC_TRY(validateCgroupName(name));
    DSEC_TRY(validateCgroupLimits(limits));
    DSEC_TRY(ensureParent(/*force=*/false));
    auto cg = std::make_unique<CgroupV2>(fs_, layout_, name);
    Status made = fs_->makeDir(cg->dir());
    if (!made.ok() && made.error().sysErrno() == ENOENT) {
      Status again = ensureParent(/*force=*/true);
      made = again.ok() ? fs_->makeDir(cg->dir()) : again;
    }
    if (!made.ok()) return mapMkdirError(made.error(), name);
    Status limited = cg->applyLimits(limits, /*fresh=*/true);
    if (!limited.ok()) {
      Status s = fs_->removeDir(cg->dir());
      if (!s.ok()) DSEC_LOG(kWarn, "cgroup") << "cleanup after failed create: " << s.error().message();
      return limited.error();
    }
    return std::unique_ptr<Cgroup>(std::move(cg));
  }

  Result<std::unique_ptr<Cgroup>> open(const std::string& name) override {
    DSEC_TRY(validateCgroupName(name));
    auto cg = std::make_unique<CgroupV2>(fs_, layout_, name);
    if (!fs_->exists(cg->dir())) return Error::notFound("cgroup " + name + " not found at " + cg->dir());
    return std::unique_ptr<Cgroup>(std::move(cg));
  }

  Result<std::vector<std::string>> list() override {
    auto names = fs_->listDirs(joinPath(layout_->root, layout_->parent));
    if (!names.ok() && names.error().sysErrno() == ENOENT) return std::vector<std::string>{};
    if (names.ok()) std::sort(names->begin(), names->end());
    return names;
  }

  std::string describe() const override {
    std::string out = "v2 (";
    const char* sep = "";
    for (const auto& c : layout_->controllers) {
      out += sep + c;
      sep = ", ";
    }
    if (layout_->controllers.empty()) out += "no controllers";
    out += " at " + layout_->root + ")";
    return out;
  }

 private:
  // Enables the controllers in the subtree_control of root and of every directory down to <parent>, making the
  // directories on the way.
  Status ensureParent(bool force) {
    std::lock_guard<std::mutex> lock(mu_);
    if (parent_ready_ && !force) return okStatus();
    std::string cur = layout_->root;
    std::vector<std::string> components;
    {
      const std::string& rel = layout_->parent;
      size_t pos = 0;
      while (pos <= rel.size()) {
        size_t end = rel.find('/', pos);
        if (end == std::string::npos) end = rel.size();
        if (end > pos) components.push_back(rel.substr(pos, end - pos));
        pos = end + 1;
      }
    }
    DSEC_TRY(enableControllers(cur));
    for (const auto& c : components) {
      cur = joinPath(cur, c);
      if (!fs_->exists(cur)) {
        Status s = makeDirIfMissing(*fs_, cur);
        if (!s.ok()) return s.error().wrap("creating parent cgroup " + cur);
      }
      DSEC_TRY(enableControllers(cur));
    }
    parent_ready_ = true;
    return okStatus();
  }

  Status enableControllers(const std::string& dir) {
    if (layout_->controllers.empty() && layout_->optional.empty()) return okStatus();
    std::string subtree_path = joinPath(dir, "cgroup.subtree_control");
    DSEC_ASSIGN_OR_RETURN(std::string enabled_text, fs_->readFile(subtree_path));
    auto enabled = words(enabled_text);
    std::string request;
    for (const auto& c : layout_->controllers) {
      if (!contains(enabled, c)) request += (request.empty() ? "+" : " +") + c;
    }
    if (!request.empty()) {
      Status s = fs_->writeFile(subtree_path, request);
      if (!s.ok()) return s.error().wrap("enabling controllers '" + request + "'");
    }
    for (const auto& c : layout_->optional) {
      if (contains(enabled, c)) continue;
      Status s = fs_->writeFile(subtree_path, "+" + c);
      if (!s.ok()) DSEC_LOG(kInfo, "cgroup") << "cannot enable " << c << " in " << dir << ": " << s.error().message();
    }
    return okStatus();
  }

  std::shared_ptr<CgroupFs> fs_;
  std::shared_ptr<const V2Layout> layout_;
  std::mutex mu_;
  bool parent_ready_ = false;
};

}  // namespace

std::unique_ptr<CgroupDriver> makeCgroupV2Driver(std::unique_ptr<CgroupFs> fs, const std::string& root,
                                                 const std::string& parent) {
  return std::make_unique<CgroupV2Driver>(std::shared_ptr<CgroupFs>(std::move(fs)), root, parent);
}

}  // namespace dsec
