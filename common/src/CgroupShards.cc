#include "CgroupShards.h"

#include <algorithm>
#include <cstdio>

namespace dsec::cgroup_internal {
namespace {

// shard@0001 < shard@0002 < ... in the book's map order, so "lowest-numbered with room" is the first found.
std::string shardName(int index) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%s%04d", std::string(kShardPrefix).c_str(), index);
  return buf;
}

}  // namespace

Status ShardBook::loadLocked() {
  if (loaded_) return okStatus();
  DSEC_ASSIGN_OR_RETURN(std::vector<std::string> top, ops_.list(""));
  counts_[""] = 0;
  for (const auto& name : top) {
    if (!isShardName(name)) {
      where_[name] = "";
      ++counts_[""];
      continue;
    }
    DSEC_ASSIGN_OR_RETURN(std::vector<std::string> inside, ops_.list(name));
    counts_[name] = static_cast<int>(inside.size());
    for (const auto& child : inside) where_[child] = name;
  }
  loaded_ = true;
  return okStatus();
}

Status ShardBook::reloadLocked() {
  loaded_ = false;
  counts_.clear();
  where_.clear();
  return loadLocked();
}

std::string ShardBook::newShardLocked() const {
  for (int i = 1;; ++i) {
    std::string name = shardName(i);
    if (!counts_.count(name)) return name;
  }
}

Result<std::string> ShardBook::place(const std::string& name) {
  std::lock_guard lock(mu_);
  DSEC_TRY(loadLocked());
  std::string chosen;
  bool found = false;
  for (const auto& [shard, count] : counts_) {
    if (count < capacity_) {
      chosen = shard;
      found = true;
      break;
    }
  }
  if (!found) {
    // All full as far as this book knows: counts of cgroups another driver removed may be stale, so read them
    // again (once per `capacity` creates at most) before making a new sub-parent.
    DSEC_TRY(reloadLocked());
    for (const auto& [shard, count] : counts_) {
      if (count < capacity_) {
        chosen = shard;
        found = true;
        break;
      }
    }
  }
  if (!found) chosen = newShardLocked();
  ++counts_[chosen];
  where_[name] = chosen;
  return chosen;
}

Result<std::string> ShardBook::locate(const std::string& name) {
  std::lock_guard lock(mu_);
  DSEC_TRY(loadLocked());
  if (auto it = where_.find(name); it != where_.end()) return it->second;
  // Not made through this book: look on disk, the parent first.
  std::string found;
  bool exists = ops_.exists(name);
  if (!exists) {
    DSEC_ASSIGN_OR_RETURN(std::vector<std::string> top, ops_.list(""));
    for (const auto& shard : top) {
      if (isShardName(shard) && ops_.exists(shard + "/" + name)) {
        found = shard;
        exists = true;
        break;
      }
    }
  }
  if (!exists) return Error::notFound("cgroup " + name + " is in no cpuset sub-parent");
  where_[name] = found;
  ++counts_[found];
  return found;
}

void ShardBook::release(const std::string& name) {
  std::lock_guard lock(mu_);
  auto it = where_.find(name);
  if (it == where_.end()) return;
  auto count = counts_.find(it->second);
  if (count != counts_.end() && count->second > 0) --count->second;
  where_.erase(it);
}

Result<std::vector<std::string>> ShardBook::listAll() {
  DSEC_ASSIGN_OR_RETURN(std::vector<std::string> top, ops_.list(""));
  std::vector<std::string> all;
  for (const auto& name : top) {
    if (!isShardName(name)) {
      all.push_back(name);
      continue;
    }
    DSEC_ASSIGN_OR_RETURN(std::vector<std::string> inside, ops_.list(name));
    all.insert(all.end(), inside.begin(), inside.end());
  }
  return all;
}

}  // namespace dsec::cgroup_internal
