// Sub-parents for sandbox cgroups in the v1 cpuset hierarchy (private to common/src).
//
// Making a cgroup under a v1 cpuset parent with clone_children walks every sibling (cpuset_css_online checks
// them for exclusive CPUs before it copies the parent's cpus/mems): 53 us per mkdir at 200 siblings, 334 us at
// 5,000, the largest part of a create that grew with the node. So the parent holds at most `capacity` sandbox
// cgroups itself, and the rest go to sub-parents <parent>/shard@N of at most `capacity` each, made on demand
// (they inherit clone_children and the parent's cpus/mems) and removed when their last sandbox goes: a walk never
// covers more than `capacity` siblings plus the sub-parents. Only cpuset is split this way: in the cpu hierarchy
// (and on v2, which has no clone_children walk) a sub-parent would be a scheduling entity of its own between the
// sandboxes and the node's parent, giving 256 SCHED_IDLE batch sandboxes one normal weight next to a latency one.
#pragma once

#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "dsec/common/Result.h"

namespace dsec::cgroup_internal {

constexpr int kShardCapacity = 256;
// '@' is never in a sandbox id or cgroup name the node makes, so a sub-parent is never taken for a sandbox.
constexpr std::string_view kShardPrefix = "shard@";

inline bool isShardName(std::string_view name) { return name.substr(0, kShardPrefix.size()) == kShardPrefix; }

class ShardBook {
 public:
  // The directory operations, relative to the parent ("" is the parent itself).
  struct Ops {
    // Child directories of <parent>/<rel>; a missing directory lists as empty.
    std::function<Result<std::vector<std::string>>(const std::string& rel)> list;
    std::function<bool(const std::string& rel)> exists;
  };

  ShardBook(Ops ops, int capacity) : ops_(std::move(ops)), capacity_(capacity > 0 ? capacity : kShardCapacity) {}

  // The sub-parent ("" for the parent itself) a new cgroup `name` goes to: the parent while it has room, else
  // the lowest-numbered sub-parent with room, else a new one. Counted from now on; release() gives it back.
  Result<std::string> place(const std::string& name);
  // The sub-parent an existing cgroup is in: the book's, else found on disk (another driver or an earlier agent
  // made it). kNotFound when it is in none.
  Result<std::string> locate(const std::string& name);
  // Forgets `name` (its cgroup was removed). The caller then tries to remove its sub-parent: the kernel refuses
  // (EBUSY) while any cgroup is in it, whoever made it, so the book's counts need not be exact for that; a create
  // racing with the removal finds its sub-parent gone (ENOENT) and makes it again.
  void release(const std::string& name);
  // Every cgroup under the parent and its sub-parents (not the sub-parents themselves).
  Result<std::vector<std::string>> listAll();

 private:
  Status loadLocked();
  // Reads the sub-parents again (another driver made or removed cgroups meanwhile).
  Status reloadLocked();
  std::string newShardLocked() const;

  Ops ops_;
  int capacity_;
  std::mutex mu_;
  bool loaded_ = false;
  std::map<std::string, int> counts_;                   // sub-parent ("" the parent) -> cgroups in it
  std::unordered_map<std::string, std::string> where_;  // cgroup name -> its sub-parent
};

}  // namespace dsec::cgroup_internal
