#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <thread>

#include "dsec/placement/ClusterPlacer.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::placement {
namespace {

constexpr int64_t kGiB = 1LL << 30;

NodeInfo node(const std::string& name, int pus = 192, int64_t memory = 1536 * kGiB) {
  NodeInfo info;
  info.name = name;
  info.capacity.pus = pus;
  info.capacity.cores = pus;
  info.capacity.memory_bytes = memory;
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
  ASSERT_OK(placer.setCommitted(full, 191.5, 0, 100));
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

TEST(ClusterPlacer, OvercommitRaisesTheLimit) {
  ClusterPlacerOptions options = seeded();
  options.cpu_overcommit = 4;
  options.memory_overcommit = 2;
  ClusterPlacer placer(options);
  NodeId n = placer.addNode(node("n", 2, 4 * kGiB));
  int placed = 0;
  while (true) {
    auto ticket = placer.place({1, kGiB});
    if (!ticket.ok()) break;
    placer.confirm(*ticket, true);
    ++placed;
  }
  EXPECT_EQ(placed, 8);  // 2 PUs x 4 = 8 CPUs; 4 GiB x 2 = 8 GiB
  ASSERT_OK(placer.setOvercommit(n, 5, 3));
  ASSERT_OK(placer.place({2, 4 * kGiB}));
  EXPECT_DOUBLE_EQ(placer.load(n)->utilisation, 10.0 / 2);
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
