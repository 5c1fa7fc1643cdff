// An in-memory cgroup file system for unit tests of the cgroup drivers (and of anything built on them).
// It keeps directories and files, records every write, fails a chosen write or mkdir on demand, and imitates the
// kernel where the drivers depend on it: a new cgroup directory gets its control files (from templates),
// cgroup.procs collects attached pids, v1 freezer.state and v2 cgroup.freeze/cgroup.events report freezing,
// v2 cgroup.kill and a SIGKILL empty cgroup.procs, rmdir refuses a cgroup with tasks or children (EBUSY), and
// v1 memory.limit_in_bytes may not exceed memory.memsw.limit_in_bytes.
#pragma once

#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "dsec/common/Cgroup.h"

namespace dsec::testing {

class FakeCgroupFs : public CgroupFs {
 public:
  // Shared between the test and the fs object the driver owns, so the test can inspect and steer it.
  struct State {
    std::mutex mu;
    std::set<std::string> dirs;
    std::map<std::string, std::string> files;
    std::vector<std::pair<std::string, std::string>> writes;  // (path, value) in order
    std::map<std::string, int> fail_write;                    // path -> errno returned by writeFile
    std::map<std::string, int> fail_mkdir;                    // path -> errno returned by makeDir
    std::map<std::string, int> fail_rmdir;                    // path -> errno returned by removeDir
    // New directories under a prefix get these files (longest matching prefix wins).
    std::map<std::string, std::map<std::string, std::string>> templates;
    std::vector<std::pair<pid_t, int>> signals;  // (pid, signal) sent through signalProcess
    bool signal_kills = true;                    // a SIGKILL removes the pid from every cgroup.procs
    int freeze_pending_reads = 0;                // freezer.state reads FREEZING this many times before FROZEN
    bool never_freezes = false;                  // freezer.state / cgroup.events never report frozen

    void addDir(const std::string& path) {
      std::lock_guard<std::mutex> lock(mu);
      dirs.insert(path);
    }
    void setFile(const std::string& path, const std::string& value) {
      std::lock_guard<std::mutex> lock(mu);
      files[path] = value;
    }
    bool hasDir(const std::string& path) {
      std::lock_guard<std::mutex> lock(mu);
      return dirs.count(path) > 0;
    }
    bool hasFile(const std::string& path) {
      std::lock_guard<std::mutex> lock(mu);
      return files.count(path) > 0;
    }
    std::string file(const std::string& path) {
      std::lock_guard<std::mutex> lock(mu);
      auto it = files.find(path);
      return it == files.end() ? "<missing>" : it->second;
    }
    // Every value written to path, in order.
    std::vector<std::string> writesTo(const std::string& path) {
      std::lock_guard<std::mutex> lock(mu);
      std::vector<std::string> out;
      for (const auto& [p, v] : writes) {
        if (p == path) out.push_back(v);
      }
      return out;
    }
    // Index of the first write to path at or after from, or -1.
    int writeIndex(const std::string& path, const std::string& value, size_t from = 0) {
      std::lock_guard<std::mutex> lock(mu);
      for (size_t i = from; i < writes.size(); ++i) {
        if (writes[i].first == path && writes[i].second == value) return static_cast<int>(i);
      }
      return -1;
    }
    // Directories below path (any depth).
    std::vector<std::string> dirsUnder(const std::string& path) {
      std::lock_guard<std::mutex> lock(mu);
      std::vector<std::string> out;
      for (const auto& d : dirs) {
        if (d.size() > path.size() && d.compare(0, path.size(), path) == 0 && d[path.size()] == '/') out.push_back(d);
      }
      return out;
    }
  };

  explicit FakeCgroupFs(std::shared_ptr<State> state) : s_(std::move(state)) {}

  Status makeDir(const std::string& path) override {
    std::lock_guard<std::mutex> lock(s_->mu);
    if (auto it = s_->fail_mkdir.find(path); it != s_->fail_mkdir.end()) return Error::sys(it->second, "mkdir " + path);
    if (s_->dirs.count(path) || s_->files.count(path)) return Error::sys(EEXIST, "mkdir " + path);
    if (!s_->dirs.count(parentOf(path))) return Error::sys(ENOENT, "mkdir " + path);
    s_->dirs.insert(path);
    const std::map<std::string, std::string>* best = nullptr;
    size_t best_len = 0;
    for (const auto& [prefix, files] : s_->templates) {
      if (path.size() > prefix.size() && path.compare(0, prefix.size(), prefix) == 0 && path[prefix.size()] == '/' &&
          prefix.size() >= best_len) {
        best = &files;
        best_len = prefix.size();
      }
    }
    if (best) {
      for (const auto& [leaf, value] : *best) s_->files[path + "/" + leaf] = value;
    }
    return okStatus();
  }

  Status removeDir(const std::string& path) override {
    std::lock_guard<std::mutex> lock(s_->mu);
    if (auto it = s_->fail_rmdir.find(path); it != s_->fail_rmdir.end()) return Error::sys(it->second, "rmdir " + path);
    if (!s_->dirs.count(path)) return Error::sys(ENOENT, "rmdir " + path);
    for (const auto& d : s_->dirs) {
      if (parentOf(d) == path) return Error::sys(EBUSY, "rmdir " + path);
    }
    if (auto it = s_->files.find(path + "/cgroup.procs"); it != s_->files.end() && !it->second.empty()) {
      return Error::sys(EBUSY, "rmdir " + path);
    }
    s_->dirs.erase(path);
    for (auto it = s_->files.begin(); it != s_->files.end();) {
      it = parentOf(it->first) == path ? s_->files.erase(it) : std::next(it);
    }
    return okStatus();
  }

  bool exists(const std::string& path) override {
    std::lock_guard<std::mutex> lock(s_->mu);
    return s_->dirs.count(path) || s_->files.count(path);
  }

  Status writeFile(const std::string& path, const std::string& value) override {
    std::lock_guard<std::mutex> lock(s_->mu);
    std::string context = "write '" + value + "' to " + path;
    if (auto it = s_->fail_write.find(path); it != s_->fail_write.end()) return Error::sys(it->second, context);
    if (s_->dirs.count(path)) return Error::sys(EISDIR, context);
    auto it = s_->files.find(path);
    if (it == s_->files.end()) return Error::sys(ENOENT, context);
    std::string dir = parentOf(path);
    std::string leaf = path.substr(dir.size() + 1);
    if (leaf == "memory.limit_in_bytes" || leaf == "memory.memsw.limit_in_bytes") {
      auto memsw = s_->files.find(dir + "/memory.memsw.limit_in_bytes");
      if (memsw != s_->files.end()) {
        int64_t mem_value =
            leaf == "memory.limit_in_bytes" ? limitValue(value) : limitValue(s_->files[dir + "/memory.limit_in_bytes"]);
        int64_t memsw_value = leaf == "memory.limit_in_bytes" ? limitValue(memsw->second) : limitValue(value);
        if (mem_value > memsw_value) return Error::sys(EINVAL, context);
      }
    }
    s_->writes.emplace_back(path, value);
    if (leaf == "cgroup.procs") {
      if (!it->second.empty() && it->second.back() != '\n') it->second += "\n";
      it->second += value + "\n";
      setEvent(dir, "populated", "1");
    } else if (leaf == "freezer.state") {
      if (value == "FROZEN") {
        it->second = s_->never_freezes || s_->freeze_pending_reads > 0 ? "FREEZING" : "FROZEN";
      } else {
        it->second = value;
      }
    } else if (leaf == "cgroup.freeze") {
      it->second = value;
      if (!(value == "1" && s_->never_freezes)) setEvent(dir, "frozen", value == "1" ? "1" : "0");
    } else if (leaf == "cgroup.kill") {
      s_->files[dir + "/cgroup.procs"] = "";
      setEvent(dir, "populated", "0");
    } else if (leaf == "cgroup.subtree_control") {
      std::string controllers = " " + s_->files[dir + "/cgroup.controllers"] + " ";
      std::string current = " " + it->second + " ";
      for (const auto& word : words(value)) {
        std::string name = word.substr(1);
        if (controllers.find(" " + name + " ") == std::string::npos) return Error::sys(ENOENT, context);
        if (word[0] == '+' && current.find(" " + name + " ") == std::string::npos) current += name + " ";
        if (word[0] == '-') current = replaceAll(current, " " + name + " ", " ");
      }
      it->second = trimSpaces(current);
    } else {
      it->second = value;
    }
    return okStatus();
  }

  Result<std::string> readFile(const std::string& path) override {
    std::lock_guard<std::mutex> lock(s_->mu);
    if (s_->dirs.count(path)) return Error::sys(EISDIR, "read " + path);
    auto it = s_->files.find(path);
    if (it == s_->files.end()) return Error::sys(ENOENT, "open " + path);
    if (it->second == "FREEZING" && endsWith(path, "/freezer.state") && !s_->never_freezes) {
      if (s_->freeze_pending_reads > 0) {
        --s_->freeze_pending_reads;
      } else {
        it->second = "FROZEN";
      }
      return std::string("FREEZING\n");
    }
    return it->second + (it->second.empty() || it->second.back() == '\n' ? "" : "\n");
  }

  Result<std::vector<std::string>> listDirs(const std::string& path) override {
    std::lock_guard<std::mutex> lock(s_->mu);
    if (!s_->dirs.count(path)) return Error::sys(ENOENT, "opendir " + path);
    std::vector<std::string> out;
    for (const auto& d : s_->dirs) {
      if (parentOf(d) == path) out.push_back(d.substr(path.size() + 1));
    }
    return out;
  }

  Status signalProcess(pid_t pid, int signal) override {
    std::lock_guard<std::mutex> lock(s_->mu);
    s_->signals.emplace_back(pid, signal);
    if (signal == SIGKILL && s_->signal_kills) {
      std::string needle = std::to_string(pid);
      for (auto& [path, value] : s_->files) {
        if (!endsWith(path, "/cgroup.procs")) continue;
        std::string kept;
        for (const auto& line : lines(value)) {
          if (line != needle) kept += line + "\n";
        }
        value = kept;
        if (kept.empty()) setEvent(parentOf(path), "populated", "0");
      }
    }
    return okStatus();
  }

 private:
  static std::string parentOf(const std::string& path) {
    size_t slash = path.rfind('/');
    return slash == std::string::npos || slash == 0 ? "/" : path.substr(0, slash);
  }
  static bool endsWith(const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
  }
  static int64_t limitValue(const std::string& text) {
    if (text.empty() || text == "-1" || text == "max") return INT64_MAX;
    return std::stoll(text);
  }
  static std::vector<std::string> lines(const std::string& text) {
    std::vector<std::string> out;
    size_t pos = 0;
    while (pos < text.size()) {
      size_t end = text.find('\n', pos);
      if (end == std::string::npos) end = text.size();
      if (end > pos) out.push_back(text.substr(pos, end - pos));
      pos = end + 1;
    }
    return out;
  }
  static std::vector<std::string> words(const std::string& text) {
    std::vector<std::string> out;
    size_t pos = 0;
    while (pos < text.size()) {
      size_t end = text.find(' ', pos);
      if (end == std::string::npos) end = text.size();
      if (end > pos) out.push_back(text.substr(pos, end - pos));
      pos = end + 1;
    }
    return out;
  }
  static std::string replaceAll(std::string s, const std::string& from, const std::string& to) {
    for (size_t pos = s.find(from); pos != std::string::npos; pos = s.find(from, pos + to.size())) {
      s.replace(pos, from.size(), to);
    }
    return s;
  }
  static std::string trimSpaces(const std::string& s) {
    size_t b = s.find_first_not_of(' ');
    if (b == std::string::npos) return "";
    return s.substr(b, s.find_last_not_of(' ') - b + 1);
  }
  // Rewrites one key of a v2 cgroup.events file if the directory has one.
  void setEvent(const std::string& dir, const std::string& key, const std::string& value) {
    auto it = s_->files.find(dir + "/cgroup.events");
    if (it == s_->files.end()) return;
    std::string out;
    for (const auto& line : lines(it->second)) {
      out += (line.compare(0, key.size() + 1, key + " ") == 0 ? key + " " + value : line) + "\n";
    }
    it->second = out;
  }

  std::shared_ptr<State> s_;
};

// A v1 tree at root like this machine's: memory, cpu, cpuacct (separate mount), pids, freezer; with cpuset also
// a cpuset hierarchy whose root has cpus 0-3 and mems 0 and whose new directories start empty (as the kernel's).
inline void setUpFakeV1Tree(FakeCgroupFs::State& s, const std::string& root, bool memsw = true,
                            bool comounted_cpuacct = false, bool cpuset = false) {
  s.addDir(root);
  std::map<std::string, std::map<std::string, std::string>> per;
  per["memory"] = {{"cgroup.procs", ""},
                   {"memory.limit_in_bytes", "9223372036854771712"},
                   {"memory.usage_in_bytes", "4096"},
                   {"memory.max_usage_in_bytes", "8192"},
                   {"memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n"},
                   {"memory.force_empty", ""},
                   {"memory.kmem.tcp.limit_in_bytes", "9223372036854771712"}};
  if (memsw) per["memory"]["memory.memsw.limit_in_bytes"] = "9223372036854771712";
  std::map<std::string, std::string> cpu = {{"cgroup.procs", ""},
                                            {"cpu.cfs_quota_us", "-1"},
                                            {"cpu.cfs_period_us", "100000"},
                                            {"cpu.shares", "1024"},
                                            {"cpu.idle", "0"}};
  std::map<std::string, std::string> cpuacct = {{"cgroup.procs", ""}, {"cpuacct.usage", "5000000"}};
  if (comounted_cpuacct) {
    cpu.insert(cpuacct.begin(), cpuacct.end());
    per["cpu,cpuacct"] = cpu;
  } else {
    per["cpu"] = cpu;
    per["cpuacct"] = cpuacct;
  }
  per["pids"] = {{"cgroup.procs", ""}, {"pids.max", "max"}, {"pids.current", "3"}};
  per["freezer"] = {{"cgroup.procs", ""}, {"freezer.state", "THAWED"}};
  if (cpuset) {
    per["cpuset"] = {{"cgroup.procs", ""}, {"cpuset.cpus", ""}, {"cpuset.mems", ""}, {"cgroup.clone_children", "0"}};
  }
  for (const auto& [h, files] : per) {
    std::string dir = root + "/" + h;
    s.addDir(dir);
    for (const auto& [leaf, value] : files) s.setFile(dir + "/" + leaf, value);
    s.templates[dir] = files;
  }
  if (cpuset) {
    s.setFile(root + "/cpuset/cpuset.cpus", "0-3");
    s.setFile(root + "/cpuset/cpuset.mems", "0");
  }
}

// A pure v2 tree at root offering cpu, memory, pids, cpuset (and others the drivers must leave alone). Without
// cpuset the root does not offer it (a delegated subtree without it).
inline void setUpFakeV2Tree(FakeCgroupFs::State& s, const std::string& root, bool with_kill = true,
                            bool cpuset = true) {
  s.addDir(root);
  s.setFile(root + "/cgroup.controllers",
            cpuset ? "cpuset cpu io memory hugetlb pids rdma misc" : "cpu io memory hugetlb pids rdma misc");
  s.setFile(root + "/cgroup.subtree_control", "");
  s.setFile(root + "/cgroup.procs", "1\n");
  std::map<std::string, std::string> files = {
      {"cgroup.procs", ""},
      {"cgroup.controllers", cpuset ? "cpuset cpu memory pids" : "cpu memory pids"},
      {"cgroup.subtree_control", ""},
      {"cgroup.events", "populated 0\nfrozen 0\n"},
      {"cgroup.freeze", "0"},
      {"memory.max", "max"},
      {"memory.current", "12345"},
      {"memory.peak", "23456"},
      {"memory.events", "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\noom_group_kill 0\n"},
      {"memory.reclaim", ""},
      {"pids.max", "max"},
      {"pids.current", "2"},
      {"cpu.max", "max 100000"},
      {"cpu.weight", "100"},
      {"cpu.idle", "0"},
      {"cpu.stat", "usage_usec 777\nuser_usec 500\nsystem_usec 277\n"},
  };
  if (with_kill) files["cgroup.kill"] = "";
  if (cpuset) {
    // v2 cpusets start empty, meaning "the parent's".
    files["cpuset.cpus"] = "";
    files["cpuset.mems"] = "";
  }
  s.templates[root] = files;
}

}  // namespace dsec::testing
