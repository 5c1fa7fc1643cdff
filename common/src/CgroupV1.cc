// cgroup v1: each controller is its own hierarchy under root/<controller>, so a sandbox is one directory per
// hierarchy (memory, cpu, cpuacct where mounted apart, pids, freezer) and every operation fans out over them.
// cpuset (CPU QoS: latency sandboxes get dedicated cores, batch ones the shared pool) is used where mounted. A new
// cpuset cgroup starts with empty cpus/mems and refuses tasks until they are set, so every directory the driver
// makes there gets them: the given values, else (clone_children, or an explicit copy) the parent's.
#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <memory>
#include <mutex>

#include "CgroupInternal.h"
#include "CgroupShards.h"
#include "dsec/common/Cgroup.h"
#include "dsec/common/Logging.h"

namespace dsec {
namespace {

using namespace cgroup_internal;

// Where the controllers live, resolved once per driver.
struct V1Layout {
  std::string root;
  std::string parent;
  std::string memory = "memory";
  std::string cpu;      // "cpu" or a co-mounted "cpu,cpuacct"
  std::string cpuacct;  // hierarchy holding cpuacct.usage: cpu's, a separate "cpuacct", or "" if none
  std::string pids = "pids";
  std::string freezer = "freezer";
  std::string cpuset;                    // "cpuset" where mounted, else "" (then no cpuset can be asked for)
  std::vector<std::string> hierarchies;  // creation order; removal goes backwards
  std::string missing;                   // required controllers not found (", "-separated)
};

V1Layout probeLayout(CgroupFs& fs, const std::string& root, const std::string& parent) {
  V1Layout l;
  l.root = root;
  l.parent = parent;
  auto mounted = [&](const std::string& dir) { return fs.exists(joinPath(joinPath(root, dir), "cgroup.procs")); };
  std::vector<std::string> missing;
  if (!mounted(l.memory)) missing.push_back("memory");
  for (const char* candidate : {"cpu", "cpu,cpuacct", "cpuacct,cpu"}) {
    if (mounted(candidate)) {
      l.cpu = candidate;
      break;
    }
  }
  if (l.cpu.empty()) missing.push_back("cpu");
  if (!mounted(l.pids)) missing.push_back("pids");
  if (!mounted(l.freezer)) missing.push_back("freezer");
  l.hierarchies = {l.memory};
  if (!l.cpu.empty()) {
    l.hierarchies.push_back(l.cpu);
    if (fs.exists(joinPath(joinPath(root, l.cpu), "cpuacct.usage"))) {
      l.cpuacct = l.cpu;
    } else if (mounted("cpuacct")) {
      l.cpuacct = "cpuacct";
      l.hierarchies.push_back(l.cpuacct);
    }
  }
  l.hierarchies.push_back(l.pids);
  l.hierarchies.push_back(l.freezer);
  if (mounted("cpuset")) {
    l.cpuset = "cpuset";
    l.hierarchies.push_back(l.cpuset);
  }
  for (size_t i = 0; i < missing.size(); ++i) l.missing += (i ? ", " : "") + missing[i];
  return l;
}

std::string cgroupDir(const V1Layout& l, const std::string& hierarchy, const std::string& name) {
  return joinPath(joinPath(joinPath(l.root, hierarchy), l.parent), name);
}

// The sandbox cgroups' sub-parents in the cpuset hierarchy (CgroupShards.h), relative to <parent> there.
ShardBook::Ops cpusetShardOps(std::shared_ptr<CgroupFs> fs, const V1Layout& l) {
  std::string base = joinPath(joinPath(l.root, l.cpuset), l.parent);
  ShardBook::Ops ops;
  ops.list = [fs, base](const std::string& rel) -> Result<std::vector<std::string>> {
    auto names = fs->listDirs(joinPath(base, rel));
    if (!names.ok() && names.error().sysErrno() == ENOENT) return std::vector<std::string>{};
    return names;
  };
  ops.exists = [fs, base](const std::string& rel) { return fs->exists(joinPath(base, rel)); };
  return ops;
}

class CgroupV1 final : public Cgroup {
 public:
  // cpuset_sub: the cpuset sub-parent the cgroup is in ("" the parent itself); shards: the driver's book of them
  // (null without a cpuset hierarchy), told when the cgroup is removed.
  CgroupV1(std::shared_ptr<CgroupFs> fs, std::shared_ptr<const V1Layout> layout, std::string name,
           std::shared_ptr<ShardBook> shards = nullptr, std::string cpuset_sub = "")
      : fs_(std::move(fs)),
        layout_(std::move(layout)),
        name_(std::move(name)),
        shards_(std::move(shards)),
        cpuset_sub_(std::move(cpuset_sub)) {}

  const std::string& name() const override { return name_; }

  std::string dir(const std::string& hierarchy) const {
    if (hierarchy == layout_->cpuset && !cpuset_sub_.empty()) {
      return joinPath(cgroupDir(*layout_, hierarchy, cpuset_sub_), name_);
    }
    return cgroupDir(*layout_, hierarchy, name_);
  }
  std::string file(const std::string& hierarchy, const char* leaf) const { return joinPath(dir(hierarchy), leaf); }

  Status attach(pid_t pid) override {
    std::string value = std::to_string(pid);
    for (const auto& h : layout_->hierarchies) {
      Status s = fs_->writeFile(file(h, "cgroup.procs"), value);
      if (!s.ok()) return s.error().wrap("attaching " + value + " to cgroup " + name_);
    }
    return okStatus();
  }

  std::vector<std::string> procsFiles() const override {
    std::vector<std::string> files;
    for (const auto& h : layout_->hierarchies) files.push_back(file(h, "cgroup.procs"));
    return files;
  }

  std::string cloneIntoPath() const override { return ""; }

  Status setLimits(const CgroupLimits& limits) override { return applyLimits(limits, /*fresh=*/false); }

  // fresh: the cgroup was just made, so everything is at its unlimited default and only set limits are written.
  Status applyLimits(const CgroupLimits& limits, bool fresh) {
    DSEC_TRY(validateCgroupLimits(limits));
    if (limits.memory_bytes > 0 || !fresh) {
      DSEC_TRY(setMemoryLimit(limits.memory_bytes > 0 ? std::to_string(limits.memory_bytes) : "-1"));
    }
    if (limits.cpus > 0 || !fresh) {
      if (!fresh) DSEC_TRY(write(layout_->cpu, "cpu.cfs_period_us", std::to_string(kCpuPeriodUsec)));
      DSEC_TRY(write(layout_->cpu, "cpu.cfs_quota_us", std::to_string(cpuQuotaUsec(limits.cpus))));
    }
    // The kernel refuses cpu.shares (EINVAL) while cpu.idle is 1: idle off first, shares, then idle on.
    const bool has_idle = fs_->exists(file(layout_->cpu, "cpu.idle"));
    if (has_idle && !fresh) DSEC_TRY(write(layout_->cpu, "cpu.idle", "0"));
    if (limits.cpu_weight > 0 || !fresh) {
      DSEC_TRY(write(layout_->cpu, "cpu.shares", std::to_string(cpuWeightToShares(limits.cpu_weight))));
    }
    if (has_idle && limits.cpu_idle) DSEC_TRY(write(layout_->cpu, "cpu.idle", "1"));
    if (limits.pids > 0 || !fresh) {
      DSEC_TRY(write(layout_->pids, "pids.max", limits.pids > 0 ? std::to_string(limits.pids) : "max"));
    }
    return applyCpuset(limits.cpuset_cpus, limits.cpuset_mems, fresh);
  }

  Status setCpuset(const std::string& cpus, const std::string& mems) override {
    DSEC_TRY(validateCpusetList(cpus, "cpuset cpus"));
    DSEC_TRY(validateCpusetList(mems, "cpuset mems"));
    if (layout_->cpuset.empty()) return noCpuset();
    if (!mems.empty()) DSEC_TRY(write(layout_->cpuset, "cpuset.mems", mems));
    if (!cpus.empty()) DSEC_TRY(write(layout_->cpuset, "cpuset.cpus", cpus));
    return okStatus();
  }

  Status freeze() override {
    DSEC_TRY(write(layout_->freezer, "freezer.state", "FROZEN"));
    Status waited = waitFreezerState("FROZEN");
    if (!waited.ok()) {
      // Do not leave the cgroup half frozen (FREEZING) behind a failed pause.
      (void)fs_->writeFile(file(layout_->freezer, "freezer.state"), "THAWED");
      return waited.error().wrap("freezing cgroup " + name_);
    }
    return okStatus();
  }

  Status thaw() override {
    DSEC_TRY(write(layout_->freezer, "freezer.state", "THAWED"));
    Status waited = waitFreezerState("THAWED");
    if (!waited.ok()) return waited.error().wrap("thawing cgroup " + name_);
    return okStatus();
  }

  Result<CgroupStats> stats() override {
    CgroupStats st;
    DSEC_ASSIGN_OR_RETURN(st.memory_current, readInt(layout_->memory, "memory.usage_in_bytes"));
    DSEC_ASSIGN_OR_RETURN(st.memory_peak, readInt(layout_->memory, "memory.max_usage_in_bytes"));
    {
      // "oom_kill N" appeared in v1 memory.oom_control with Linux 4.13; older kernels simply report 0.
      DSEC_ASSIGN_OR_RETURN(std::string text, fs_->readFile(file(layout_->memory, "memory.oom_control")));
      st.oom_kills = keyedValue(text, "oom_kill").value_or(0);
    }
    DSEC_ASSIGN_OR_RETURN(st.pids_current, readInt(layout_->pids, "pids.current"));
    if (!layout_->cpuacct.empty()) {
      DSEC_ASSIGN_OR_RETURN(int64_t ns, readInt(layout_->cpuacct, "cpuacct.usage"));
      st.cpu_usage_usec = static_cast<uint64_t>(ns / 1000);
    }
    DSEC_ASSIGN_OR_RETURN(std::string state, fs_->readFile(file(layout_->freezer, "freezer.state")));
    st.frozen = trimView(state) == "FROZEN";
    return st;
  }

  // The union over every hierarchy: a process whose attach failed half way is in some of them only, and a
  // cgroup left half made by a crash may lack some directories.
  Result<std::vector<pid_t>> pids() override {
    std::vector<pid_t> all;
    for (const auto& h : layout_->hierarchies) {
      auto text = fs_->readFile(file(h, "cgroup.procs"));
      if (!text.ok()) {
        if (text.error().sysErrno() == ENOENT) continue;
        return text.error();
      }
      for (pid_t pid : parsePids(*text)) {
        if (std::find(all.begin(), all.end(), pid) == all.end()) all.push_back(pid);
      }
    }
    return all;
  }

  Status reclaim() override {
    Status s = fs_->writeFile(file(layout_->memory, "memory.force_empty"), "0");
    if (!s.ok()) {
      int err = s.error().sysErrno();
      // force_empty is best effort: with live tasks it can give up (EBUSY) or be interrupted; that is not a failure
      // of the sandbox.
      if (err == EBUSY || err == EAGAIN || err == EINTR || err == EINVAL) {
        DSEC_LOG(kDebug, "cgroup") << "reclaim " << name_ << ": " << s.error().message();
        return okStatus();
      }
      return s.error().wrap("reclaiming memory of cgroup " + name_);
    }
    return okStatus();
  }

  Status killAll() override {
    // Freezing first stops a fork bomb from outrunning the kill loop; SIGKILL is delivered when thawed.
    bool has_freezer = fs_->exists(dir(layout_->freezer));
    if (has_freezer) {
      Status frozen = freeze();
      if (!frozen.ok()) DSEC_LOG(kWarn, "cgroup") << "killAll " << name_ << ": " << frozen.error().message();
    }
    Status killed = killListed();
    Status thawed = has_freezer ? thaw() : okStatus();
    if (!killed.ok()) return killed.error().wrap("killing cgroup " + name_);
    if (!thawed.ok()) return thawed;
    Status empty = pollUntil(
        [&]() -> Result<bool> {
          DSEC_ASSIGN_OR_RETURN(auto left, pids());
          if (left.empty()) return true;
          // Anything still listed (a task that was mid-fork) gets killed again.
          for (pid_t pid : left) (void)fs_->signalProcess(pid, SIGKILL);
          return false;
        },
        kKillTimeoutSeconds, "waiting for cgroup " + name_ + " to empty");
    return empty;
  }

  Status remove() override {
    std::vector<std::string> pending;
    for (auto it = layout_->hierarchies.rbegin(); it != layout_->hierarchies.rend(); ++it) pending.push_back(dir(*it));
    Status s = removeDirsPatiently(*fs_, pending);
    if (!s.ok()) return s.error().wrap("removing cgroup " + name_);
    if (shards_) {
      shards_->release(name_);
      removeShardIfEmpty(*fs_, *layout_, cpuset_sub_);
    }
    return okStatus();
  }

  // The cpuset sub-parent goes with its last cgroup: the kernel refuses (EBUSY) while any is left, and a create
  // that picked it meanwhile makes it again (ENOENT on its side).
  static void removeShardIfEmpty(CgroupFs& fs, const V1Layout& l, const std::string& shard) {
    if (shard.empty()) return;
    Status s = fs.removeDir(cgroupDir(l, l.cpuset, shard));
    if (!s.ok() && s.error().sysErrno() != EBUSY && s.error().sysErrno() != ENOENT) {
      DSEC_LOG(kDebug, "cgroup") << "removing empty cpuset sub-parent " << shard << ": " << s.error().message();
    }
  }

 private:
  Status noCpuset() const {
    return Error(ErrorCode::kUnsupported,
                 "cgroup " + name_ + ": no cpuset hierarchy mounted under " + layout_->root + " (cannot pin CPUs)");
  }

  // Every cpuset cgroup needs cpus and mems before it takes a task. Given values are written; otherwise a fresh
  // cgroup keeps what clone_children copied, or gets the parent's (which an existing one is reset to).
  Status applyCpuset(const std::string& cpus, const std::string& mems, bool fresh) {
    if (layout_->cpuset.empty()) {
      if (!cpus.empty() || !mems.empty()) return noCpuset();
      return okStatus();
    }
    std::string parent_dir = joinPath(joinPath(joinPath(layout_->root, layout_->cpuset), layout_->parent), cpuset_sub_);
    for (const char* leaf : {"cpuset.mems", "cpuset.cpus"}) {
      std::string value = std::string(leaf) == "cpuset.mems" ? mems : cpus;
      if (value.empty()) {
        if (fresh) {
          DSEC_ASSIGN_OR_RETURN(std::string current, fs_->readFile(file(layout_->cpuset, leaf)));
          if (!trimView(current).empty()) continue;
        }
        DSEC_ASSIGN_OR_RETURN(std::string inherited, fs_->readFile(joinPath(parent_dir, leaf)));
        value = std::string(trimView(inherited));
      }
      DSEC_TRY(write(layout_->cpuset, leaf, value));
    }
    return okStatus();
  }

  Status write(const std::string& hierarchy, const char* leaf, const std::string& value) {
    Status s = fs_->writeFile(file(hierarchy, leaf), value);
    if (!s.ok()) return s.error().wrap("cgroup " + name_ + ": setting " + leaf);
    return okStatus();
  }

  Result<int64_t> readInt(const std::string& hierarchy, const char* leaf) {
    std::string path = file(hierarchy, leaf);
    DSEC_ASSIGN_OR_RETURN(std::string text, fs_->readFile(path));
    auto v = parseInt64(text);
    if (!v) return Error::internal("unexpected contents of " + path + ": '" + text + "'");
    return *v;
  }

  // memory.memsw.limit_in_bytes (memory+swap) must stay >= memory.limit_in_bytes, so the order of the two writes
  // depends on whether the limit goes down (memory first) or up (memsw first). Try down first; EINVAL means up.
  Status setMemoryLimit(const std::string& value) {
    std::string memsw = file(layout_->memory, "memory.memsw.limit_in_bytes");
    bool has_memsw = fs_->exists(memsw);
    Status s = fs_->writeFile(file(layout_->memory, "memory.limit_in_bytes"), value);
    if (s.ok()) {
      if (has_memsw) DSEC_TRY(write(layout_->memory, "memory.memsw.limit_in_bytes", value));
      return setSocketMemoryLimit(value);
    }
    if (!has_memsw || s.error().sysErrno() != EINVAL)
      return s.error().wrap("cgroup " + name_ + ": setting memory limit");
    DSEC_TRY(write(layout_->memory, "memory.memsw.limit_in_bytes", value));
    DSEC_TRY(write(layout_->memory, "memory.limit_in_bytes", value));
    return setSocketMemoryLimit(value);
  }

  // v1 charges socket buffers to a cgroup only once it has a TCP limit of its own (v2 counts them in memory.max):
  // without one, a sandbox of 64 MiB pinned hundreds of MiB of the node's TCP memory (net.ipv4.tcp_mem, one budget
  // for every socket of the node) through its own loopback, on its way to starving the node's TCP. The same limit
  // again, so a sandbox's socket buffers are bounded like the rest of its memory.
  Status setSocketMemoryLimit(const std::string& value) {
    if (!fs_->exists(file(layout_->memory, "memory.kmem.tcp.limit_in_bytes"))) return okStatus();
    return write(layout_->memory, "memory.kmem.tcp.limit_in_bytes", value);
  }

  Status waitFreezerState(const char* want) {
    std::string path = file(layout_->freezer, "freezer.state");
    return pollUntil(
        [&]() -> Result<bool> {
          DSEC_ASSIGN_OR_RETURN(std::string state, fs_->readFile(path));
          return trimView(state) == want;
        },
        kFreezeTimeoutSeconds, std::string("waiting for ") + path + " to read " + want);
  }

  Status killListed() {
    DSEC_ASSIGN_OR_RETURN(auto list, pids());
    for (pid_t pid : list) DSEC_TRY(fs_->signalProcess(pid, SIGKILL));
    return okStatus();
  }

  std::shared_ptr<CgroupFs> fs_;
  std::shared_ptr<const V1Layout> layout_;
  std::string name_;
  std::shared_ptr<ShardBook> shards_;
  std::string cpuset_sub_;
};

class CgroupV1Driver final : public CgroupDriver {
 public:
  CgroupV1Driver(std::shared_ptr<CgroupFs> fs, const std::string& root, const std::string& parent, int shard_capacity)
      : fs_(std::move(fs)), layout_(std::make_shared<V1Layout>(probeLayout(*fs_, root, parent))) {
    if (!layout_->cpuset.empty()) {
      shards_ = std::make_shared<ShardBook>(cpusetShardOps(fs_, *layout_), shard_capacity);
    }
  }

  int version() const override { return 1; }

  Result<std::unique_ptr<Cgroup>> create(const std::string& name, const CgroupLimits& limits) override {
    DSEC_TRY(validateCgroupName(name));
    DSEC_TRY(validateCgroupLimits(limits));
    DSEC_TRY(checkUsable());
    DSEC_TRY(ensureParent(/*force=*/false));
    std::string sub;
    if (shards_) {
      DSEC_ASSIGN_OR_RETURN(sub, shards_->place(name));
    }
    auto cg = std::make_unique<CgroupV1>(fs_, layout_, name, shards_, sub);
    std::vector<std::string> created;
    auto undo = [&]() {
      for (auto it = created.rbegin(); it != created.rend(); ++it) {
        Status s = fs_->removeDir(*it);
        if (!s.ok()) DSEC_LOG(kWarn, "cgroup") << "cleanup after failed create: " << s.error().message();
      }
      if (shards_) {
        shards_->release(name);
        CgroupV1::removeShardIfEmpty(*fs_, *layout_, sub);
      }
    };
    for (const auto& h : layout_->hierarchies) {
      std::string dir = cg->dir(h);
      Status s = h == layout_->cpuset && !sub.empty() ? makeShard(sub) : okStatus();
      if (s.ok()) s = fs_->makeDir(dir);
      if (!s.ok() && s.error().sysErrno() == ENOENT) {
        // The parent (or the sub-parent) vanished since we made it (someone cleaned up): make it again once.
        Status again = ensureParent(/*force=*/true);
        if (again.ok() && h == layout_->cpuset && !sub.empty()) again = makeShard(sub);
        s = again.ok() ? fs_->makeDir(dir) : again;
      }
      if (!s.ok()) {
        undo();
        return mapMkdirError(s.error(), name);
      }
      created.push_back(dir);
    }
    Status limited = cg->applyLimits(limits, /*fresh=*/true);
    if (!limited.ok()) {
      undo();
      return limited.error();
    }
    return std::unique_ptr<Cgroup>(std::move(cg));
  }

  Result<std::unique_ptr<Cgroup>> open(const std::string& name) override {
    DSEC_TRY(validateCgroupName(name));
    DSEC_TRY(checkUsable());
    // Present in any hierarchy is enough: what a crash left half made must still open, to be killed and removed.
    std::string sub;
    if (shards_) {
      auto located = shards_->locate(name);
      if (located.ok()) {
        sub = *located;
      } else if (located.error().code() != ErrorCode::kNotFound) {
        return located.error();
      }
    }
    auto cg = std::make_unique<CgroupV1>(fs_, layout_, name, shards_, sub);
    for (const auto& h : layout_->hierarchies) {
      if (fs_->exists(cg->dir(h))) return std::unique_ptr<Cgroup>(std::move(cg));
    }
    return Error::notFound("cgroup " + name + " not found under " + layout_->parent);
  }

  // Children of the parent in any hierarchy (in cpuset, of its sub-parents too), so a leftover in one hierarchy
  // only is still found and reaped.
  Result<std::vector<std::string>> list() override {
    std::vector<std::string> all;
    for (const auto& h : layout_->hierarchies) {
      if (h == layout_->cpuset && shards_) {
        DSEC_ASSIGN_OR_RETURN(std::vector<std::string> names, shards_->listAll());
        all.insert(all.end(), names.begin(), names.end());
        continue;
      }
      auto names = fs_->listDirs(joinPath(joinPath(layout_->root, h), layout_->parent));
      if (!names.ok()) {
        if (names.error().sysErrno() == ENOENT) continue;
        return names.error();
      }
      all.insert(all.end(), names->begin(), names->end());
    }
    std::sort(all.begin(), all.end());
    all.erase(std::unique(all.begin(), all.end()), all.end());
    return all;
  }

  std::string describe() const override {
    std::string out = "v1 (";
    const char* sep = "";
    for (const auto& h : layout_->hierarchies) {
      out += sep + h;
      sep = ", ";
    }
    out += " at " + layout_->root + ")";
    if (!layout_->missing.empty()) out += "; missing: " + layout_->missing;
    return out;
  }

 private:
  Status checkUsable() const {
    if (!layout_->missing.empty()) {
      return Error(ErrorCode::kUnsupported,
                   "cgroup v1 controllers not mounted under " + layout_->root + ": " + layout_->missing);
    }
    return okStatus();
  }

  Status ensureParent(bool force) {
    std::lock_guard<std::mutex> lock(mu_);
    if (parent_ready_ && !force) return okStatus();
    for (const auto& h : layout_->hierarchies) {
      Status s = makeDirsUnder(*fs_, joinPath(layout_->root, h), layout_->parent);
      if (!s.ok()) return s.error().wrap("creating parent cgroup " + layout_->parent + " in " + h);
    }
    if (!layout_->cpuset.empty()) {
      Status s = prepareCpusetParents();
      if (!s.ok()) return s.error().wrap("preparing parent cgroup " + layout_->parent + " in cpuset");
    }
    parent_ready_ = true;
    return okStatus();
  }

  // A cpuset sub-parent for sandbox cgroups: made if missing, with the parent's cpus/mems where still empty (it
  // inherits them and clone_children from <parent>; an explicit copy covers a parent without clone_children).
  Status makeShard(const std::string& sub) {
    std::string parent_dir = cgroupDir(*layout_, layout_->cpuset, "");
    std::string dir = joinPath(parent_dir, sub);
    if (!fs_->exists(dir)) DSEC_TRY(makeDirIfMissing(*fs_, dir));
    for (const char* leaf : {"cpuset.mems", "cpuset.cpus"}) {
      DSEC_ASSIGN_OR_RETURN(std::string mine, fs_->readFile(joinPath(dir, leaf)));
      if (!trimView(mine).empty()) continue;
      DSEC_ASSIGN_OR_RETURN(std::string theirs, fs_->readFile(joinPath(parent_dir, leaf)));
      DSEC_TRY(fs_->writeFile(joinPath(dir, leaf), std::string(trimView(theirs))));
    }
    return okStatus();
  }

  // Each directory from the hierarchy's root down to <parent> gets its parent's cpus/mems where still empty (a
  // directory made by mkdir has none), and <parent> gets clone_children so sandboxes start with the pool.
  Status prepareCpusetParents() {
    std::string cur = joinPath(layout_->root, layout_->cpuset);
    const std::string& rel = layout_->parent;
    size_t pos = 0;
    while (pos <= rel.size()) {
      size_t end = rel.find('/', pos);
      if (end == std::string::npos) end = rel.size();
      if (end > pos) {
        std::string child = joinPath(cur, rel.substr(pos, end - pos));
        for (const char* leaf : {"cpuset.mems", "cpuset.cpus"}) {
          DSEC_ASSIGN_OR_RETURN(std::string mine, fs_->readFile(joinPath(child, leaf)));
          if (!trimView(mine).empty()) continue;
          DSEC_ASSIGN_OR_RETURN(std::string theirs, fs_->readFile(joinPath(cur, leaf)));
          DSEC_TRY(fs_->writeFile(joinPath(child, leaf), std::string(trimView(theirs))));
        }
        cur = child;
      }
      pos = end + 1;
    }
    std::string clone = joinPath(cur, "cgroup.clone_children");
    if (fs_->exists(clone)) {
      Status s = fs_->writeFile(clone, "1");
      if (!s.ok()) DSEC_LOG(kDebug, "cgroup") << "clone_children: " << s.error().message();
    }
    return okStatus();
  }

  std::shared_ptr<CgroupFs> fs_;
  std::shared_ptr<const V1Layout> layout_;
  std::shared_ptr<ShardBook> shards_;  // null without a cpuset hierarchy
  std::mutex mu_;
  bool parent_ready_ = false;
};

}  // namespace

std::unique_ptr<CgroupDriver> makeCgroupV1Driver(std::unique_ptr<CgroupFs> fs, const std::string& root,
                                                 const std::string& parent, int cpuset_shard_capacity) {
  return std::make_unique<CgroupV1Driver>(std::shared_ptr<CgroupFs>(std::move(fs)), root, parent,
                                          cpuset_shard_capacity);
}

}  // namespace dsec
