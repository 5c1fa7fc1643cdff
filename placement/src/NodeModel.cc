// hwloc -> NodeModel. The only file (with TopologyXml below) that includes hwloc.
#include "dsec/placement/NodeModel.h"

#include <hwloc.h>
#include <sys/stat.h>

#include <map>
#include <memory>
#include <utility>

#include "dsec/placement/CpuList.h"

namespace dsec::placement {

namespace {

struct TopologyDeleter {
  void operator()(hwloc_topology* topology) const { hwloc_topology_destroy(topology); }
};
using TopologyPtr = std::unique_ptr<hwloc_topology, TopologyDeleter>;

enum class Source { kSystem, kXml, kSynthetic };

Result<TopologyPtr> loadTopology(Source source, const std::string& arg) {
  hwloc_topology_t raw = nullptr;
  if (hwloc_topology_init(&raw) != 0) return Error::sys(errno, "hwloc_topology_init");
  TopologyPtr topology(raw);
  if (source == Source::kXml) {
    if (hwloc_topology_set_xml(raw, arg.c_str()) != 0) return Error::sys(errno, "hwloc: cannot use XML file " + arg);
  } else if (source == Source::kSynthetic) {
    if (hwloc_topology_set_synthetic(raw, arg.c_str()) != 0) {
      return Error::invalid("hwloc: bad synthetic topology '" + arg + "' (e.g. \"pack:2 [numa(memory=384GiB)] " +
                            "l3:12 core:8 pu:1\")");
    }
  }
  if (hwloc_topology_load(raw) != 0) {
    std::string what = source == Source::kSystem ? "this machine" : arg;
    return Error::sys(errno, "hwloc: loading the topology of " + what);
  }
  return topology;
}

int logicalOrZero(hwloc_obj_t obj) { return obj == nullptr ? 0 : static_cast<int>(obj->logical_index); }

}  // namespace

class NodeModelBuilder {
 public:
  static Result<NodeModel> build(hwloc_topology_t topo, std::string source) {
    NodeModel model;
    model.source_ = std::move(source);

    int packages = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PACKAGE);
    model.packages_.resize(std::max(packages, 1));
    for (size_t i = 0; i < model.packages_.size(); ++i) model.packages_[i].index = static_cast<int>(i);

    int numa_count = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
    if (numa_count <= 0) return Error::internal("hwloc reports no NUMA node for " + model.source_);
    std::vector<hwloc_obj_t> numa_objs;
    for (int i = 0; i < numa_count; ++i) {
      hwloc_obj_t obj = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, i);
      NumaDomain domain;
      domain.index = i;
      domain.os_index = static_cast<int>(obj->os_index);
      domain.package = logicalOrZero(hwloc_get_ancestor_obj_by_type(topo, HWLOC_OBJ_PACKAGE, obj));
      domain.memory_bytes = static_cast<int64_t>(obj->attr->numanode.local_memory);
      model.packages_[domain.package].numa.push_back(i);
      model.numa_.push_back(std::move(domain));
      numa_objs.push_back(obj);
    }

    // A machine whose hwloc shows no Core level (some VMs) gets one core per PU.
    hwloc_obj_type_t core_type = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE) > 0 ? HWLOC_OBJ_CORE : HWLOC_OBJ_PU;
    int core_count = hwloc_get_nbobjs_by_type(topo, core_type);
    std::map<std::pair<int, int>, int> l3_index;  // (L3 logical index or -1, numa) -> group
    for (int i = 0; i < core_count; ++i) {
      hwloc_obj_t obj = hwloc_get_obj_by_type(topo, core_type, i);
      Core core;
      core.index = i;
      core.package = logicalOrZero(hwloc_get_ancestor_obj_by_type(topo, HWLOC_OBJ_PACKAGE, obj));
      for (size_t n = 0; n < numa_objs.size(); ++n) {
        if (hwloc_bitmap_intersects(numa_objs[n]->cpuset, obj->cpuset)) {
          core.numa = static_cast<int>(n);
          break;
        }
      }
      unsigned pu = 0;
      hwloc_bitmap_foreach_begin(pu, obj->cpuset) { core.pus.push_back(static_cast<int>(pu)); }
      hwloc_bitmap_foreach_end();
      if (core.pus.empty()) continue;  // a core without allowed PUs is not ours to place on
      model.pu_count_ += static_cast<int>(core.pus.size());
      hwloc_obj_t l3 = hwloc_get_ancestor_obj_by_type(topo, HWLOC_OBJ_L3CACHE, obj);
      auto key = std::make_pair(l3 == nullptr ? -1 : static_cast<int>(l3->logical_index), core.numa);
      auto [it, inserted] = l3_index.emplace(key, static_cast<int>(model.l3_.size()));
      if (inserted) {
        L3Group group;
        group.index = it->second;
        group.numa = core.numa;
        model.l3_.push_back(group);
        model.numa_[core.numa].l3_groups.push_back(group.index);
      }
      core.l3_group = it->second;
      core.index = static_cast<int>(model.cores_.size());
      model.l3_[core.l3_group].cores.push_back(core.index);
      model.numa_[core.numa].cores.push_back(core.index);
      model.cores_.push_back(std::move(core));
    }
    if (model.cores_.empty()) return Error::internal("hwloc reports no usable core for " + model.source_);
    for (auto& domain : model.numa_) domain.cpuset = model.cpusetOfCores(domain.cores);
    return model;
  }
};

const std::vector<SyntheticAlias>& syntheticAliases() {
  static const std::vector<SyntheticAlias> kAliases = {
      {"2x96c-1.5t", "pack:2 [numa(memory=768GiB)] l3:12 core:8 pu:1",
       "DSec cell node: 2 sockets x 96 cores, 1.5 TiB, no SMT"},
      {"2x96c-1.5t-smt", "pack:2 [numa(memory=768GiB)] l3:12 core:8 pu:2", "the same with SMT (384 PUs)"},
      {"2x96c-1.5t-nps4", "pack:2 group:4 [numa(memory=192GiB)] l3:3 core:8 pu:2",
       "the same with SMT in NPS4 mode (8 NUMA domains)"},
  };
  return kAliases;
}

std::string expandAlias(const std::string& spec) {
  for (const auto& alias : syntheticAliases()) {
    if (spec == alias.name) return alias.description;
  }
  return spec;
}

namespace {

bool looksLikeXml(const std::string& spec) {
  if (spec.size() > 4 && spec.compare(spec.size() - 4, 4, ".xml") == 0) return true;
  struct stat st {};
  return spec.find('/') != std::string::npos && ::stat(spec.c_str(), &st) == 0;
}

Result<std::pair<Source, std::string>> resolveSpec(const std::string& spec) {
  if (spec.empty() || spec == "system") return std::make_pair(Source::kSystem, std::string());
  if (looksLikeXml(spec)) return std::make_pair(Source::kXml, spec);
  return std::make_pair(Source::kSynthetic, expandAlias(spec));
}

}  // namespace

Result<NodeModel> NodeModel::fromSystem() {
  DSEC_ASSIGN_OR_RETURN(auto topology, loadTopology(Source::kSystem, ""));
  return NodeModelBuilder::build(topology.get(), "system");
}

Result<NodeModel> NodeModel::fromXmlFile(const std::string& path) {
  DSEC_ASSIGN_OR_RETURN(auto topology, loadTopology(Source::kXml, path));
  return NodeModelBuilder::build(topology.get(), "xml:" + path);
}

Result<NodeModel> NodeModel::fromSynthetic(const std::string& description) {
  std::string expanded = expandAlias(description);
  DSEC_ASSIGN_OR_RETURN(auto topology, loadTopology(Source::kSynthetic, expanded));
  return NodeModelBuilder::build(topology.get(), "synthetic:" + expanded);
}

Result<NodeModel> NodeModel::fromSpec(const std::string& spec) {
  DSEC_ASSIGN_OR_RETURN(auto resolved, resolveSpec(spec));
  switch (resolved.first) {
    case Source::kSystem:
      return fromSystem();
    case Source::kXml:
      return fromXmlFile(resolved.second);
    case Source::kSynthetic:
      return fromSynthetic(resolved.second);
  }
  return Error::internal("unreachable");
}

Status exportTopologyXml(const std::string& spec, const std::string& path) {
  DSEC_ASSIGN_OR_RETURN(auto resolved, resolveSpec(spec));
  DSEC_ASSIGN_OR_RETURN(auto topology, loadTopology(resolved.first, resolved.second));
  if (hwloc_topology_export_xml(topology.get(), path.c_str(), 0) != 0) {
    return Error::sys(errno, "hwloc: exporting the topology to " + path);
  }
  return okStatus();
}

int64_t NodeModel::memoryBytes() const {
  int64_t total = 0;
  for (const auto& domain : numa_) total += domain.memory_bytes;
  return total;
}

NodeSummary NodeModel::summary() const {
  NodeSummary s;
  s.packages = static_cast<int>(packages_.size());
  s.numa_domains = static_cast<int>(numa_.size());
  s.l3_groups = static_cast<int>(l3_.size());
  s.cores = static_cast<int>(cores_.size());
  s.pus = pu_count_;
  s.memory_bytes = memoryBytes();
  return s;
}

std::string NodeModel::cpusetOfCores(const std::vector<int>& cores) const {
  std::vector<int> pus;
  for (int c : cores) pus.insert(pus.end(), cores_[c].pus.begin(), cores_[c].pus.end());
  return formatCpuList(std::move(pus));
}

std::string NodeModel::cpusetAll() const {
  std::vector<int> pus;
  for (const auto& core : cores_) pus.insert(pus.end(), core.pus.begin(), core.pus.end());
  return formatCpuList(std::move(pus));
}

std::string NodeModel::memsOf(const std::vector<int>& numa_indices) const {
  std::vector<int> os;
  for (int n : numa_indices) os.push_back(numa_[n].os_index);
  return formatCpuList(std::move(os));
}

}  // namespace dsec::placement
