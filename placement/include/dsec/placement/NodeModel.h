// What a node is made of, read from hwloc: packages, NUMA domains with their memory, L3 groups, cores and PUs.
// Loaded from the real machine, an hwloc XML file (slurmd writes one) or a synthetic description, so a 2-socket
// 192-core 1.5 TB node can be modelled and tested on a 2-core machine. Plain data: no hwloc handle is kept, so
// a model is cheap to copy and hwloc stays out of every other header.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dsec/common/Result.h"

namespace dsec::placement {

struct Core {
  int index = 0;         // logical, 0..cores-1 in hwloc order
  int package = 0;       // index into NodeModel::packages()
  int numa = 0;          // index into NodeModel::numaDomains()
  int l3_group = 0;      // index into NodeModel::l3Groups()
  std::vector<int> pus;  // OS indices of its hardware threads (what cpusets name)
};

// The cores sharing one L3 cache inside one NUMA domain (an L3 spanning two domains, as with Intel SNC, is
// split, so a group never crosses a domain). A node without an L3 level gets one group per domain.
struct L3Group {
  int index = 0;
  int numa = 0;
  std::vector<int> cores;  // logical core indices
};

struct NumaDomain {
  int index = 0;     // position in NodeModel::numaDomains()
  int os_index = 0;  // what cpuset.mems and set_mempolicy name
  int package = 0;
  int64_t memory_bytes = 0;  // local memory; 0 when the source does not say (a synthetic "[numa]")
  std::vector<int> cores;    // logical core indices
  std::vector<int> l3_groups;
  std::string cpuset;  // its PUs in list format
};

struct Package {
  int index = 0;
  std::vector<int> numa;  // indices into numaDomains()
};

// What the fleet needs to know about a node: capacity for placement, shape for reports.
struct NodeSummary {
  int packages = 0;
  int numa_domains = 0;
  int l3_groups = 0;
  int cores = 0;
  int pus = 0;
  int64_t memory_bytes = 0;
};

class NodeModel {
 public:
  // The machine we run on.
  static Result<NodeModel> fromSystem();
  // An hwloc XML export (`lstopo node.xml`, slurmd's hwloc_topo_whole.xml).
  static Result<NodeModel> fromXmlFile(const std::string& path);
  // An hwloc synthetic description ("pack:2 [numa(memory=384GiB)] l3:12 core:8 pu:1") or an alias
  // (see syntheticAliases()).
  static Result<NodeModel> fromSynthetic(const std::string& description);
  // One string for command lines: "system" (or ""), an alias, a path to an .xml file, or a synthetic description.
  static Result<NodeModel> fromSpec(const std::string& spec);

  const std::string& source() const { return source_; }
  const std::vector<Package>& packages() const { return packages_; }
  const std::vector<NumaDomain>& numaDomains() const { return numa_; }
  const std::vector<L3Group>& l3Groups() const { return l3_; }
  const std::vector<Core>& cores() const { return cores_; }
  int puCount() const { return pu_count_; }
  int64_t memoryBytes() const;
  NodeSummary summary() const;
  // PUs of the given logical cores, in list format ("0-11,96-107").
  std::string cpusetOfCores(const std::vector<int>& cores) const;
  // Every PU of the node.
  std::string cpusetAll() const;
  // NUMA OS indices in list format, for cpuset.mems.
  std::string memsOf(const std::vector<int>& numa_indices) const;

 private:
  friend class NodeModelBuilder;
  std::string source_;
  std::vector<Package> packages_;
  std::vector<NumaDomain> numa_;
  std::vector<L3Group> l3_;
  std::vector<Core> cores_;
  int pu_count_ = 0;
};

struct SyntheticAlias {
  const char* name;
  const char* description;
  const char* what;
};
// Short names for the node shapes the benchmarks and tests use: "2x96c-1.5t" is the DSec cell's node
// (2 sockets x 96 cores, 1.5 TB), plus its SMT and NPS4 variants.
const std::vector<SyntheticAlias>& syntheticAliases();
// The synthetic description behind an alias, or the input unchanged.
std::string expandAlias(const std::string& spec);

// Writes the topology named by spec (as for NodeModel::fromSpec) to an hwloc XML file, so a synthetic or real
// node can be saved and loaded later (or handed to slurmd-like tooling).
Status exportTopologyXml(const std::string& spec, const std::string& path);

}  // namespace dsec::placement
