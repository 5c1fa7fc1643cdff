// `dsec bench gateway` on a small simulated cell: every create through the real gateway succeeds, lands on
// the node its id names (the nodes' books match) and the sandboxes are spread over every node. No timing
// assertions: the figures are the bench's to report.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "CliRunner.h"
#include "dsec/common/Strings.h"

namespace dsec::testing {
namespace {

nlohmann::json lastJsonLine(const std::string& out) {
  auto lines = split(trim(out), '\n');
  if (lines.empty()) return nullptr;
  return nlohmann::json::parse(lines.back(), nullptr, false);
}

TEST(CliBenchGateway, SmallSimulatedCellTakesEveryCreate) {
  auto r =
      runDsec({"bench", "gateway", "--simulated-nodes", "5", "--count", "300", "--concurrency", "4", "--warmup", "20"},
              {}, 120);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  auto summary = lastJsonLine(r.out);
  ASSERT_TRUE(summary.is_object()) << r.out;
  EXPECT_EQ(summary["failures"], 0);
  EXPECT_EQ(summary["count"], 300);
  EXPECT_EQ(summary["nodes"], 5);
  EXPECT_EQ(summary["concurrency"], 4);
  EXPECT_EQ(summary["created"], 320);
  EXPECT_EQ(summary["held_on_nodes"], 320);
  EXPECT_EQ(summary["books_match"], true);
  EXPECT_GT(summary["creates_per_second"].get<double>(), 0);
  EXPECT_GE(summary["p99_ms"].get<double>(), summary["p50_ms"].get<double>());
  // Power of two choices over equal nodes: every node takes a fair share (mean 64).
  EXPECT_GE(summary["spread"]["min"].get<int>(), 30) << summary.dump();
  EXPECT_LE(summary["spread"]["max"].get<int>(), 100) << summary.dump();
}

TEST(CliBenchGateway, RejectsBadArguments) {
  EXPECT_EQ(runDsec({"bench", "gateway", "--simulated-nodes", "0"}).exit_code, 2);
  EXPECT_EQ(runDsec({"bench", "gateway", "--count", "0"}).exit_code, 2);
}

}  // namespace
}  // namespace dsec::testing
