#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <thread>

#include "dsec/placement/ClusterPlacer.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::placement {
namespace {

constexpr int64_t kGiB = 1LL << 30;

// What a node with static limits (ratios 1) reports, nothing committed.
NodeAdmission reported(double cpus, int64_t memory, double cpu_ratio = 1, double memory_ratio = 1) {
  NodeAdmission a;
  a.cpus = cpus;
  a.memory_capacity_bytes = memory;
  a.cpu_ratio = cpu_ratio;
  a.memory_ratio = memory_ratio;
  return a;
}

NodeInfo node(const std::string& name, int pus = 192, int64_t memory = 1536 * kGiB) {
  NodeInfo info;
  info.name = name;
  info.capacity.pus = pus;
  info.capacity.cores = pus;
  info.capacity.memory_bytes = memory;
  info.admission = reported(pus, memory);
  return info;
}

ClusterPlacerOptions seeded(uint64_t seed = 1, Strategy strategy = Strategy::kPowerOfK) {
  ClusterPlacerOptions options;
  options.seed = seed;
  options.strategy = strategy;
  return options;
}

double maxOverMean(const std::vector<NodeLoad>& loads) {
  double sum = 0;
  double max = 0;
  for (const auto& l : loads) {
    sum += l.utilisation;
    max = std::max(max, l.utilisation);
  }
  return max / (sum / static_cast<double>(loads.size()));
}

TEST(ClusterPlacer, FiltersUnhealthyDrainingUnsupportedAndFullNodes) {
  ClusterPlacer placer(seeded());
  NodeInfo sick = node("sick");
  sick.healthy = false;
  NodeInfo leaving = node("leaving");
  leaving.draining = true;
  NodeInfo vms = node("vms");
  vms.backends = {"microvm"};
  placer.addNode(sick);
  placer.addNode(leaving);
  placer.addNode(vms);
  NodeId full = placer.addNode(node("full"));
  NodeId good = placer.addNode(node("good"));
  NodeAdmission books = reported(192, 1536 * kGiB);
  books.cpu_committed = 191.5;
  ASSERT_OK(placer.setAdmission(full, books, 100));
  for (int i = 0; i < 200; ++i) {
    auto ticket = placer.place({1, kGiB, "container"});
    ASSERT_OK(ticket);
    EXPECT_EQ(ticket->node, good);
    placer.confirm(*ticket, false);
  }
  // A microVM goes to the only node that runs microVMs; "" means any backend.
  auto vm = placer.place({1, kGiB, "microvm"});
  ASSERT_OK(vm);
  EXPECT_EQ(placer.name(vm->node), "vms");
  placer.confirm(*vm, false);
  // Health and draining change at run time.
  ASSERT_OK(placer.setHealthy(*placer.find("sick"), true));
  ASSERT_OK(placer.setDraining(good, true));
  std::set<std::string> chosen;
  for (int i = 0; i < 50; ++i) {
    auto ticket = placer.place({1, kGiB, ""});
    ASSERT_OK(ticket);
    chosen.insert(placer.name(ticket->node));
    placer.confirm(*ticket, false);
  }
  EXPECT_EQ(chosen, (std::set<std::string>{"sick", "vms"}));
}

TEST(ClusterPlacer, InFlightRequestsCountUntilConfirmed) {
  ClusterPlacer placer(seeded());
  NodeId a = placer.addNode(node("a", 4, 8 * kGiB));
  NodeId b = placer.addNode(node("b", 4, 8 * kGiB));
  std::vector<Ticket> tickets;
  for (int i = 0; i < 8; ++i) {
    auto ticket = placer.place({1, kGiB});
    ASSERT_OK(ticket);
    tickets.push_back(*ticket);
  }
  // Nothing confirmed yet, but both nodes are spoken for.
  EXPECT_EQ(placer.load(a)->in_flight, 4);
  EXPECT_EQ(placer.load(b)->in_flight, 4);
  EXPECT_DOUBLE_EQ(placer.load(a)->in_flight_cpus, 4);
  EXPECT_DOUBLE_EQ(placer.load(a)->committed_cpus, 0);
  ASSERT_ERROR(placer.place({1, kGiB}), ErrorCode::kResourceExhausted);
  // A reject frees its share; an accept turns in-flight into committed.
  placer.confirm(tickets[0], false);
  placer.confirm(tickets[1], true);
  NodeLoad load = *placer.load(tickets[1].node);
  EXPECT_EQ(load.sandboxes, 1);
  EXPECT_DOUBLE_EQ(load.committed_cpus, 1);
  EXPECT_EQ(load.committed_memory, kGiB);
  auto again = placer.place({1, kGiB});
  ASSERT_OK(again);
  EXPECT_EQ(again->node, tickets[0].node);
  // A destroyed sandbox gives its room back.
  placer.release(tickets[1].node, 1, kGiB);
  EXPECT_DOUBLE_EQ(placer.load(tickets[1].node)->committed_cpus, 0);
}

TEST(ClusterPlacer, ARejectIsPlacedAgainElsewhere) {
  ClusterPlacer placer(seeded(3));
  for (const char* name : {"n0", "n1", "n2"}) placer.addNode(node(name));
  std::vector<NodeId> refused;
  std::set<NodeId> tried;
  for (int attempt = 0; attempt < 3; ++attempt) {
    auto ticket = placer.place({2, 4 * kGiB}, refused);
    ASSERT_OK(ticket);
    EXPECT_TRUE(tried.insert(ticket->node).second) << "placed again on a node that refused";
    placer.confirm(*ticket, false);  // the node's admission said no
    refused.push_back(ticket->node);
  }
  auto none = placer.place({2, 4 * kGiB}, refused);
  ASSERT_ERROR(none, ErrorCode::kResourceExhausted);
  EXPECT_NE(none.error().message().find("3 already refused it"), std::string::npos) << none.error().message();
  for (const auto& load : placer.loads()) {
    EXPECT_EQ(load.in_flight, 0);
    EXPECT_DOUBLE_EQ(load.committed_cpus, 0);
  }
}

TEST(ClusterPlacer, PowerOfTwoBalancesTenThousandSandboxesOnHundredNodes) {
  auto fill = [](Strategy strategy) {
    ClusterPlacerOptions options = seeded(11, strategy);
    options.k = 2;
    ClusterPlacer placer(options);
    for (int i = 0; i < 100; ++i) placer.addNode(node("n" + std::to_string(i)));
    for (int i = 0; i < 10000; ++i) {
      auto ticket = placer.place({1, 2 * kGiB});
      EXPECT_TRUE(ticket.ok());
      if (ticket.ok()) placer.confirm(*ticket, true);
    }
    return placer.loads();
  };
  auto ours = fill(Strategy::kPowerOfK);
  double spread = maxOverMean(ours);
  EXPECT_LT(spread, 1.1);
  int64_t total = 0;
  for (const auto& l : ours) total += l.sandboxes;
  EXPECT_EQ(total, 10000);
  // And it does better than picking at random.
  EXPECT_LT(spread, maxOverMean(fill(Strategy::kRandom)));
  EXPECT_LT(maxOverMean(fill(Strategy::kLeastLoaded)), 1.02);
}

TEST(ClusterPlacer, NothingFitsIsAClearError) {
  ClusterPlacer placer(seeded());
  NodeInfo sick = node("sick");
  sick.healthy = false;
  placer.addNode(sick);
  placer.addNode(node("a"));
  placer.addNode(node("b"));
  auto big = placer.place({500, kGiB});
  ASSERT_ERROR(big, ErrorCode::kResourceExhausted);
  const std::string& message = big.error().message();
  EXPECT_NE(message.find("no node can take a sandbox of 500 CPUs"), std::string::npos) << message;
  EXPECT_NE(message.find("of 3 nodes 2 are full, 1 unhealthy"), std::string::npos) << message;
  EXPECT_NE(message.find("the most room is on"), std::string::npos) << message;
  auto backend = placer.place({1, kGiB, "fullvm"});
  ASSERT_ERROR(backend, ErrorCode::kResourceExhausted);
  EXPECT_NE(backend.error().message().find("no node runs that backend (known: container)"), std::string::npos)
      << backend.error().message();
  ASSERT_ERROR(placer.place({0, kGiB}), ErrorCode::kInvalidArgument);
  ASSERT_ERROR(placer.place({1, -1}), ErrorCode::kInvalidArgument);
  ClusterPlacer empty(seeded());
  ASSERT_ERROR(empty.place({1, kGiB}), ErrorCode::kResourceExhausted);
}

TEST(ClusterPlacer, TheNodesReportedRatiosSetTheLimit) {
  ClusterPlacer placer(seeded());
  NodeInfo info = node("n", 2, 4 * kGiB);
  info.admission = reported(2, 4 * kGiB, 4, 2);
  NodeId n = placer.addNode(info);
  int placed = 0;
  while (true) {
    auto ticket = placer.place({1, kGiB});
    if (!ticket.ok()) break;
    placer.confirm(*ticket, true);
    ++placed;
  }
  EXPECT_EQ(placed, 8);  // 2 CPUs x 4 = 8 CPUs; 4 GiB x 2 = 8 GiB
  // The node's density controller raised its ratios; its report says so (and counts the 8 it holds).
  NodeAdmission raised = reported(2, 4 * kGiB, 5, 3);
  raised.cpu_committed = 8;
  raised.memory_committed_bytes = 8 * kGiB;
  ASSERT_OK(placer.setAdmission(n, raised, 8));
  ASSERT_OK(placer.place({2, 4 * kGiB}));
  EXPECT_DOUBLE_EQ(placer.load(n)->utilisation, 10.0 / 2);
  ASSERT_ERROR(placer.setAdmission(n, reported(2, kGiB, -1, 1), 0), ErrorCode::kInvalidArgument);
}

// The bug this rule replaced: a gateway ratio of 8 on three 1-CPU nodes refused the 25th idle sandbox of the
// default 1 CPU, while every node (CPU ratio 1024) would have taken it.
TEST(ClusterPlacer, DefaultCpusOnOneCpuNodesAreAdmittedByTheNodesRatio) {
  ClusterPlacer placer(seeded(9));
  for (const char* name : {"n1", "n2", "n3"}) {
    NodeInfo info = node(name, 1, 4 * kGiB);
    info.admission = reported(1, 4 * kGiB, 1024, 8);  // a calm node's density controller
    placer.addNode(info);
  }
  for (int i = 0; i < 30; ++i) {
    auto ticket = placer.place({1, 512LL << 20});
    ASSERT_OK(ticket);
    placer.confirm(*ticket, true);
  }
  int64_t total = 0;
  for (const auto& load : placer.loads()) {
    EXPECT_GE(load.sandboxes, 5) << load.name;  // least loaded of 2: every node takes its share
    total += load.sandboxes;
  }
  EXPECT_EQ(total, 30);
}

TEST(ClusterPlacer, ANodeThatDoesNotAdmitGetsNothing) {
  ClusterPlacer placer(seeded(4));
  NodeId calm = placer.addNode(node("calm"));
  NodeId pressed = placer.addNode(node("pressed"));
  NodeAdmission closed = reported(192, 1536 * kGiB);
  closed.admitting = false;
  ASSERT_OK(placer.setAdmission(pressed, closed, 0, "memory PSI some avg10 31.0%"));
  for (int i = 0; i < 50; ++i) {
    auto ticket = placer.place({1, kGiB});
    ASSERT_OK(ticket);
    EXPECT_EQ(ticket->node, calm);
    placer.confirm(*ticket, true);
  }
  ASSERT_OK(placer.setAdmission(calm, closed, 50, "OOM kill under the node's memory limit 3 s ago"));
  auto none = placer.place({1, kGiB});
  ASSERT_ERROR(none, ErrorCode::kResourceExhausted);
  const std::string& message = none.error().message();
  EXPECT_NE(message.find("of 2 nodes 0 are full, 2 not admitting"), std::string::npos) << message;
  EXPECT_NE(message.find("calm: memory pressure on the node, admission is closed (OOM kill under the node's memory "
                         "limit 3 s ago)"),
            std::string::npos)
      << message;
  // Pressure falls: the next report opens it again.
  ASSERT_OK(placer.setAdmission(pressed, reported(192, 1536 * kGiB), 0));
  auto again = placer.place({1, kGiB});
  ASSERT_OK(again);
  EXPECT_EQ(again->node, pressed);
}

TEST(ClusterPlacer, TicketsInFlightCountOnTopOfTheNodesReport) {
  ClusterPlacer placer(seeded(2));
  NodeInfo info = node("n", 4, 2 * kGiB);
  info.admission = reported(4, 2 * kGiB);
  info.admission->free_sandboxes = 10;
  NodeId n = placer.addNode(info);
  auto a = placer.place({1, kGiB});
  auto b = placer.place({1, kGiB});
  ASSERT_OK(a);
  ASSERT_OK(b);
  // Both are in flight: the node's 2 GiB are spoken for although its report says nothing is committed.
  auto c = placer.place({1, kGiB});
  ASSERT_ERROR(c, ErrorCode::kResourceExhausted);
  EXPECT_NE(c.error().message().find("memory: 2048 MiB committed + 1024 MiB asked > 1.00 x 2048 MiB"),
            std::string::npos)
      << c.error().message();
  // A report that does not include them yet (sent before the creates landed) keeps them counted.
  NodeAdmission fresh = reported(4, 2 * kGiB);
  fresh.free_sandboxes = 10;
  ASSERT_OK(placer.setAdmission(n, fresh, 0));
  ASSERT_ERROR(placer.place({1, kGiB}), ErrorCode::kResourceExhausted);
  // One is refused by the node: its share comes back. The other is confirmed: committed until the next report.
  placer.confirm(*a, false);
  placer.confirm(*b, true);
  EXPECT_EQ(placer.load(n)->committed_memory, kGiB);
  EXPECT_EQ(placer.load(n)->admission.free_sandboxes, 9);
  ASSERT_OK(placer.place({1, kGiB}));
  // Sandbox slots count in flight too.
  NodeAdmission one_slot = reported(4, 64 * kGiB);
  one_slot.free_sandboxes = 2;
  ASSERT_OK(placer.setAdmission(n, one_slot, 5));  // 2 free, 1 ticket still in flight
  ASSERT_OK(placer.place({1, kGiB}));
  auto full = placer.place({1, kGiB});
  ASSERT_ERROR(full, ErrorCode::kResourceExhausted);
  EXPECT_NE(full.error().message().find("no free sandbox slot"), std::string::npos) << full.error().message();
}

TEST(ClusterPlacer, LatencySandboxesNeedTheNodesFreeDedicatedCores) {
  ClusterPlacer placer(seeded(6));
  NodeInfo none = node("no-cores", 8, 64 * kGiB);
  none.admission->free_dedicated_cores = 0;
  NodeInfo some = node("cores", 8, 64 * kGiB);
  some.admission->free_dedicated_cores = 3;
  placer.addNode(none);
  NodeId cores = placer.addNode(some);
  ClusterRequest latency{2, kGiB, "container", true};
  auto first = placer.place(latency);
  ASSERT_OK(first);
  EXPECT_EQ(first->node, cores);
  EXPECT_EQ(first->dedicated_cores, 2);
  // 3 free - 2 in flight = 1: not enough for another 2-CPU latency sandbox, enough for a 1-CPU one.
  auto second = placer.place(latency);
  ASSERT_ERROR(second, ErrorCode::kResourceExhausted);
  EXPECT_NE(second.error().message().find("latency sandbox needs 2 dedicated cores"), std::string::npos)
      << second.error().message();
  ASSERT_OK(placer.place({0.5, kGiB, "container", true}));
  // Batch sandboxes need no dedicated cores.
  ASSERT_OK(placer.place({2, kGiB}));
}

TEST(ClusterPlacer, AnUnreportedNodeIsLeftToDecide) {
  ClusterPlacer placer(seeded(8));
  NodeInfo silent = node("silent", 1, kGiB);
  silent.admission.reset();
  NodeId id = placer.addNode(silent);
  // Nothing is checked here until the node reports: its own admission (and 429) decide.
  for (int i = 0; i < 5; ++i) {
    auto ticket = placer.place({4, 2 * kGiB});
    ASSERT_OK(ticket);
    placer.confirm(*ticket, true);
  }
  EXPECT_FALSE(placer.load(id)->admission_known);
  ASSERT_OK(placer.setAdmission(id, reported(1, kGiB), 5));
  ASSERT_ERROR(placer.place({4, 2 * kGiB}), ErrorCode::kResourceExhausted);
}

TEST(ClusterPlacer, SameSeedSameDecisions) {
  auto run = [] {
    ClusterPlacer placer(seeded(1234));
    for (int i = 0; i < 20; ++i) placer.addNode(node("n" + std::to_string(i)));
    std::vector<NodeId> picks;
    for (int i = 0; i < 500; ++i) {
      auto ticket = placer.place({1.0 + i % 3, kGiB});
      picks.push_back(ticket->node);
      placer.confirm(*ticket, true);
    }
    return picks;
  };
  EXPECT_EQ(run(), run());
}

TEST(ClusterPlacer, ReRegisteringANodeKeepsItsIdAndBooks) {
  ClusterPlacer placer(seeded());
  NodeId a = placer.addNode(node("a"));
  auto ticket = placer.place({1, kGiB});
  placer.confirm(*ticket, true);
  NodeInfo again = node("a", 96);
  again.admission.reset();  // a registration without a report keeps the books
  again.draining = true;
  EXPECT_EQ(placer.addNode(again), a);
  EXPECT_EQ(placer.nodeCount(), 1u);
  NodeLoad load = *placer.load(a);
  EXPECT_TRUE(load.draining);
  EXPECT_DOUBLE_EQ(load.capacity_cpus, 96);
  EXPECT_DOUBLE_EQ(load.committed_cpus, 1);
  ASSERT_ERROR(placer.find("b"), ErrorCode::kNotFound);
  ASSERT_ERROR(placer.setHealthy(7, true), ErrorCode::kNotFound);
}

TEST(ClusterPlacer, ConcurrentDecisionsKeepTheBooksExact) {
  ClusterPlacer placer(seeded(5));
  for (int i = 0; i < 40; ++i) placer.addNode(node("n" + std::to_string(i)));
  constexpr int kThreads = 4;
  constexpr int kEach = 5000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&placer, t] {
      for (int i = 0; i < kEach; ++i) {
        auto ticket = placer.place({0.5, kGiB / 4});
        if (ticket.ok()) placer.confirm(*ticket, (i + t) % 2 == 0);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  int64_t sandboxes = 0;
  double cpus = 0;
  for (const auto& load : placer.loads()) {
    sandboxes += load.sandboxes;
    cpus += load.committed_cpus;
    EXPECT_EQ(load.in_flight, 0);
  }
  EXPECT_EQ(sandboxes, kThreads * kEach / 2);
  EXPECT_DOUBLE_EQ(cpus, 0.5 * kThreads * kEach / 2);
}

}  // namespace
}  // namespace dsec::placement
