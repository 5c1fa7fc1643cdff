#include <gtest/gtest.h>
#include <sched.h>

#include <cmath>
#include <set>

#include "dsec/placement/CpuList.h"
#include "dsec/placement/NodePlacer.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::placement {
namespace {

constexpr int64_t kGiB = 1LL << 30;

NodeModel model(const std::string& spec) {
  auto m = NodeModel::fromSynthetic(spec);
  EXPECT_TRUE(m.ok()) << m.error().toString();
  return std::move(m).value();
}

SandboxRequest latency(const std::string& id, double cpus, int64_t memory = kGiB) {
  return {id, Qos::kLatency, cpus, memory};
}
SandboxRequest batch(const std::string& id, double cpus = 1, int64_t memory = kGiB) {
  return {id, Qos::kBatch, cpus, memory};
}

std::set<int> cpusOf(const std::string& list) {
  auto ids = parseCpuList(list);
  EXPECT_TRUE(ids.ok()) << list;
  return {ids->begin(), ids->end()};
}

TEST(NodePlacer, LatencyCpusetsStayInOneNumaDomainAndNeverOverlap) {
  NodeModel m = model("pack:2 [numa(memory=384GiB)] l3:12 core:8 pu:1");
  NodePlacerOptions options;
  options.min_shared_cores = 16;
  NodePlacer placer(m, options);
  std::set<int> used;
  int i = 0;
  for (double cpus : {1.0, 4.0, 8.0, 12.0, 24.0, 2.0, 8.0, 30.0, 3.0}) {
    auto p = placer.place(latency("l" + std::to_string(i++), cpus));
    ASSERT_OK(p);
    ASSERT_EQ(p->numa_nodes.size(), 1u);
    EXPECT_EQ(p->mems, std::to_string(p->numa_nodes[0]));
    std::set<int> cpus_of = cpusOf(p->cpuset);
    EXPECT_EQ(cpus_of.size(), static_cast<size_t>(std::ceil(cpus)));
    std::set<int> domain = cpusOf(m.numaDomains()[p->numa_nodes[0]].cpuset);
    std::set<int> l3s;
    for (int cpu : cpus_of) {
      EXPECT_TRUE(domain.count(cpu)) << "cpu " << cpu << " of " << p->cpuset << " outside its NUMA domain";
      EXPECT_TRUE(used.insert(cpu).second) << "cpu " << cpu << " dedicated twice";
      l3s.insert(m.cores()[cpu].l3_group);
    }
    // Up to 8 cores fit in one L3 group, and then they must.
    if (cpus <= 8) {
      EXPECT_EQ(l3s.size(), 1u) << p->cpuset;
    }
    EXPECT_EQ(p->sched_policy, SCHED_OTHER);
  }
  // Spread: the first two land in different domains.
  EXPECT_NE(placer.placementOf("l0")->numa_nodes[0], placer.placementOf("l1")->numa_nodes[0]);
  // The shared pool is exactly what nobody owns.
  std::set<int> shared = cpusOf(placer.sharedCpuset());
  EXPECT_EQ(shared.size() + used.size(), 192u);
  for (int cpu : used) EXPECT_FALSE(shared.count(cpu));
}

TEST(NodePlacer, SharedPoolShrinksAndRecoversOnRelease) {
  NodePlacer placer(model("pack:2 [numa(memory=384GiB)] l3:12 core:8 pu:1"), {});
  EXPECT_EQ(placer.sharedCpuset(), "0-191");
  auto a = placer.place(latency("a", 8));
  auto b = placer.place(latency("b", 8));
  ASSERT_OK(a);
  ASSERT_OK(b);
  EXPECT_EQ(a->cpuset, "0-7");
  EXPECT_EQ(b->cpuset, "96-103");
  EXPECT_EQ(placer.sharedCpuset(), "8-95,104-191");
  EXPECT_EQ(placer.usage().dedicated_cores, 16);
  EXPECT_EQ(placer.usage().shared_cores, 176);
  // A batch sandbox sees the current pool.
  auto batch_placement = placer.place(batch("x"));
  ASSERT_OK(batch_placement);
  EXPECT_EQ(batch_placement->cpuset, "8-95,104-191");
  ASSERT_OK(placer.release("a"));
  EXPECT_EQ(placer.sharedCpuset(), "0-95,104-191");
  EXPECT_EQ(placer.placementOf("x")->cpuset, "0-95,104-191");
  ASSERT_OK(placer.release("b"));
  EXPECT_EQ(placer.sharedCpuset(), "0-191");
  EXPECT_EQ(placer.usage().dedicated_cores, 0);
  ASSERT_ERROR(placer.release("b"), ErrorCode::kNotFound);
  // The freed cores are given out again.
  auto c = placer.place(latency("c", 8));
  ASSERT_OK(c);
  EXPECT_EQ(c->cpuset, "0-7");
}

TEST(NodePlacer, RefusesLatencyWhenNoDomainHasEnoughFreeCores) {
  // 2 domains of 8 cores, no L3 level.
  NodePlacerOptions options;
  options.min_shared_cores = 1;
  NodePlacer placer(model("pack:2 [numa(memory=8GiB)] core:8 pu:1"), options);
  ASSERT_OK(placer.place(latency("a", 6)));
  ASSERT_OK(placer.place(latency("b", 6)));
  // 2 + 2 free: 3 cores fit in no single domain.
  auto refused = placer.place(latency("c", 3));
  ASSERT_ERROR(refused, ErrorCode::kResourceExhausted);
  EXPECT_NE(refused.error().message().find("no NUMA domain has 3 free cores"), std::string::npos)
      << refused.error().message();
  EXPECT_NE(refused.error().message().find("0:2, 1:2"), std::string::npos) << refused.error().message();
  ASSERT_OK(placer.place(latency("d", 2)));
  // 2 more cores would fit domain 1 but take the pool below its minimum.
  auto pool = placer.place(latency("e", 2));
  ASSERT_ERROR(pool, ErrorCode::kResourceExhausted);
  EXPECT_NE(pool.error().message().find("must stay shared"), std::string::npos) << pool.error().message();
  // Batch still fits in the pool, and the refused sandboxes left nothing behind.
  ASSERT_OK(placer.place(batch("f")));
  EXPECT_EQ(placer.usage().dedicated_cores, 14);
  EXPECT_EQ(placer.usage().latency_sandboxes, 3);
  EXPECT_EQ(placer.sharedCpuset(), "14-15");
  ASSERT_OK(placer.release("d"));
  ASSERT_OK(placer.place(latency("e", 2)));
}

TEST(NodePlacer, LatencyMemoryMustFitItsDomain) {
  NodePlacer placer(model("pack:2 [numa(memory=8GiB)] core:8 pu:1"), {});
  ASSERT_OK(placer.place(latency("a", 1, 6 * kGiB)));
  auto b = placer.place(latency("b", 1, 6 * kGiB));
  ASSERT_OK(b);
  // Each domain has 8 GiB: the second went to the other domain.
  EXPECT_NE(placer.placementOf("a")->numa_nodes[0], b->numa_nodes[0]);
  ASSERT_ERROR(placer.place(latency("c", 1, 3 * kGiB)), ErrorCode::kResourceExhausted);
}

TEST(NodePlacer, BatchRunsSchedIdleWithLowWeightInTheSharedPool) {
  NodePlacer placer(model("pack:2 [numa(memory=384GiB)] l3:12 core:8 pu:1"), {});
  auto l = placer.place(latency("l", 2));
  auto b = placer.place(batch("b", 4, 8 * kGiB));
  ASSERT_OK(l);
  ASSERT_OK(b);
  EXPECT_EQ(b->qos, Qos::kBatch);
  EXPECT_EQ(b->sched_policy, SCHED_IDLE);
  EXPECT_LT(b->cpu_weight, 100u);
  EXPECT_LT(b->cpu_weight, l->cpu_weight);
  EXPECT_EQ(b->cpuset, placer.sharedCpuset());
  EXPECT_EQ(b->numa_nodes, (std::vector<int>{0, 1}));
  EXPECT_EQ(b->mems, "0-1");
  EXPECT_TRUE(b->cores.empty());
  EXPECT_EQ(placer.usage().batch_sandboxes, 1);
  ASSERT_ERROR(placer.place(batch("b")), ErrorCode::kAlreadyExists);
  ASSERT_ERROR(placer.place(batch("")), ErrorCode::kInvalidArgument);
  ASSERT_ERROR(placer.place(batch("z", 0)), ErrorCode::kInvalidArgument);
}

TEST(NodePlacer, SmtLatencySandboxesGetWholeCores) {
  NodeModel m = model("pack:2 [numa] l3:12 core:8 pu:2");
  NodePlacer placer(m, {});
  auto p = placer.place(latency("l", 3));
  ASSERT_OK(p);
  // 3 CPUs = 2 cores with both siblings each.
  EXPECT_EQ(p->cores.size(), 2u);
  EXPECT_EQ(p->cpuset, "0-3");
  auto q = placer.place(latency("q", 1));
  ASSERT_OK(q);
  EXPECT_EQ(cpusOf(q->cpuset).size(), 2u);
}

TEST(NodePlacer, Nps4LatencySandboxFillsOneDomainAcrossItsL3Groups) {
  NodeModel m = model("pack:2 group:4 [numa(memory=96GiB)] l3:3 core:8 pu:2");
  NodePlacer placer(m, {});
  auto p = placer.place(latency("big", 48));  // 24 cores = a whole NPS4 domain
  ASSERT_OK(p);
  ASSERT_EQ(p->numa_nodes.size(), 1u);
  EXPECT_EQ(p->cpuset, m.numaDomains()[p->numa_nodes[0]].cpuset);
  auto q = placer.place(latency("q", 16));
  ASSERT_OK(q);
  EXPECT_NE(q->numa_nodes[0], p->numa_nodes[0]);
  // 16 PUs = 8 cores = exactly one L3 group.
  std::set<int> l3s;
  for (int c : q->cores) l3s.insert(m.cores()[c].l3_group);
  EXPECT_EQ(l3s.size(), 1u);
  ASSERT_ERROR(placer.place(latency("too-big", 50)), ErrorCode::kResourceExhausted);
}

TEST(NodePlacer, AdmissionFollowsTheOvercommitRatios) {
  NodePlacerOptions options;
  options.cpu_overcommit = 2;
  options.memory_overcommit = 1.5;
  NodePlacer placer(model("pack:1 [numa(memory=16GiB)] core:8 pu:1"), options);  // 8 PUs, 16 GiB
  for (int i = 0; i < 16; ++i) ASSERT_OK(placer.place(batch("b" + std::to_string(i), 1, kGiB)));
  auto full = placer.place(batch("over"));
  ASSERT_ERROR(full, ErrorCode::kResourceExhausted);
  EXPECT_NE(full.error().message().find("16 of 16 CPUs"), std::string::npos) << full.error().message();
  placer.setOvercommit(4, 0);
  ASSERT_OK(placer.place(batch("over", 1, 7 * kGiB)));  // 23 GiB of 24
  auto memory = placer.place(batch("mem", 1, 2 * kGiB));
  ASSERT_ERROR(memory, ErrorCode::kResourceExhausted);
  EXPECT_NE(memory.error().message().find("memory"), std::string::npos);
  NodeUsage u = placer.usage();
  EXPECT_EQ(u.committed_cpus, 17);
  EXPECT_EQ(u.committed_memory, 23 * kGiB);
  EXPECT_EQ(u.cpu_capacity, 32);
  EXPECT_EQ(u.memory_capacity, 24 * kGiB);
}

TEST(NodePlacer, CommitmentsPerNumaDomain) {
  NodePlacer placer(model("pack:2 [numa(memory=64GiB)] core:8 pu:1"), {});
  ASSERT_OK(placer.place(latency("l", 4, 10 * kGiB)));
  ASSERT_OK(placer.place(batch("b", 6, 12 * kGiB)));
  auto numa = placer.numaUsage();
  ASSERT_EQ(numa.size(), 2u);
  // Domain 0 holds the latency sandbox (4 dedicated); batch splits by shared cores: 4 in domain 0, 8 in 1.
  EXPECT_EQ(numa[0].dedicated_cores, 4);
  EXPECT_EQ(numa[1].dedicated_cores, 0);
  EXPECT_DOUBLE_EQ(numa[0].committed_cpus, 4 + 6.0 * 4 / 12);
  EXPECT_DOUBLE_EQ(numa[1].committed_cpus, 6.0 * 8 / 12);
  EXPECT_EQ(numa[0].committed_memory, 10 * kGiB + 4 * kGiB);
  EXPECT_EQ(numa[1].committed_memory, 8 * kGiB);
  EXPECT_EQ(numa[0].memory_bytes, 64 * kGiB);
}

TEST(NodePlacer, BindingGoesThroughTheBinderAndFollowsThePool) {
  RecordingBinder binder;
  NodePlacer placer(model("pack:2 [numa(memory=8GiB)] core:8 pu:1"), {}, &binder);
  auto cg = BindTarget::cgroup("/sys/fs/cgroup/cpuset/dsec/b1");
  ASSERT_OK(placer.place(batch("b1")));
  ASSERT_OK(placer.bind("b1", cg));
  EXPECT_EQ(binder.last("cpus", cg), "0-15");
  EXPECT_EQ(binder.last("mems", cg), "0-1");
  EXPECT_EQ(binder.last("sched", cg), std::to_string(SCHED_IDLE));

  auto pid = BindTarget::process(4242);
  auto l = placer.place(latency("l1", 4));
  ASSERT_OK(l);
  // The pool shrank: the bound batch sandbox was moved off the dedicated cores.
  EXPECT_EQ(binder.last("cpus", cg), "4-15");
  ASSERT_OK(placer.bind("l1", pid));
  EXPECT_EQ(binder.last("cpus", pid), "0-3");
  EXPECT_EQ(binder.last("mems", pid), "0");
  EXPECT_EQ(binder.last("sched", pid), std::to_string(SCHED_OTHER));

  ASSERT_OK(placer.release("l1"));
  EXPECT_EQ(binder.last("cpus", cg), "0-15");
  ASSERT_ERROR(placer.bind("nope", pid), ErrorCode::kNotFound);
  binder.failNext(Error::sys(EPERM, "write cpuset.cpus"));
  ASSERT_OK(placer.place(batch("b2")));
  auto failed = placer.bind("b2", BindTarget::process(7));
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.error().message().find("binding sandbox b2"), std::string::npos);
}

TEST(PlacementQos, ParsesTheApiSpelling) {
  EXPECT_EQ(*parseQos("latency"), Qos::kLatency);
  EXPECT_EQ(*parseQos("batch"), Qos::kBatch);
  EXPECT_EQ(*parseQos(""), Qos::kBatch);
  ASSERT_ERROR(parseQos("realtime"), ErrorCode::kInvalidArgument);
  EXPECT_STREQ(qosName(Qos::kLatency), "latency");
}

}  // namespace
}  // namespace dsec::placement
