// Smoke tests of the machine sandboxes' benches: `dsec bench create --backend microvm` and `dsec bench fork
// --backend microvm` run through an embedded node with tiny counts and print their lines and summary. They check
// that the benches run and say what they measured, not the figures (timings belong to a quiet host, not CI).
// They skip when the node reports no microvm backend (no QEMU, no guest kernel), naming why.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "CliRunner.h"
#include "dsec/common/Process.h"
#include "dsec/common/Strings.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::testing {
namespace {

nlohmann::json lastJsonLine(const std::string& out) {
  auto lines = split(trim(out), '\n');
  if (lines.empty()) return nullptr;
  return nlohmann::json::parse(lines.back(), nullptr, false);
}

// The reason to skip when the bench's node has no microvm backend ("" otherwise).
std::string noMicrovm(const CliResult& r) {
  auto at = r.err.find("the node has no microvm backend");
  return at == std::string::npos ? "" : r.err.substr(at);
}

#define DSEC_SKIP_UNLESS_BENCH_CAN_RUN()                                                     \
  DSEC_SKIP_UNLESS_ROOT();                                                                   \
  if (findProgram("mkfs.erofs").empty()) GTEST_SKIP() << "mkfs.erofs missing (erofs-utils)"; \
  if (findProgram("qemu-system-x86_64").empty()) GTEST_SKIP() << "needs qemu-system-x86_64 (qemu-system-x86)"

TEST(CliBenchVm, CreatePrintsColdRestoreAndPeerSideBySide) {
  DSEC_SKIP_UNLESS_BENCH_CAN_RUN();
  TempDir root;
  auto r = runDsec({"bench", "create", "--backend", "microvm", "--count", "2", "--root", root.path()}, {}, 500);
  if (std::string why = noMicrovm(r); !why.empty()) GTEST_SKIP() << why;
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  for (const char* line : {"cold ", "restore ", "peer ", "restore/peer p50", "cold/peer p50",
                           "target restore to first exec p50 <= 80 ms under TCG: "}) {
    EXPECT_NE(r.out.find(line), std::string::npos) << line << " missing in:\n" << r.out;
  }
  auto summary = lastJsonLine(r.out);
  ASSERT_TRUE(summary.is_object()) << r.out;
  EXPECT_EQ(summary["backend"], "microvm");
  EXPECT_EQ(summary["count"], 2);
  EXPECT_EQ(summary["failures"], 0) << r.out << r.err;
  for (const char* key : {"cold_p50_ms", "restore_p50_ms", "peer_p50_ms"}) {
    EXPECT_GT(summary[key].get<double>(), 0) << key;
  }
  EXPECT_TRUE(summary["restore_target_met"].is_boolean());
}

TEST(CliBenchVm, ForkMeasuresLatencyAndEachCopysMemory) {
  DSEC_SKIP_UNLESS_BENCH_CAN_RUN();
  TempDir root;
  auto r = runDsec({"bench", "fork", "--backend", "microvm", "--count", "2", "--root", root.path()}, {}, 500);
  if (std::string why = noMicrovm(r); !why.empty()) GTEST_SKIP() << why;
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  for (const char* line : {"fork of 2: ", "first command in each copy", "single restore, one at a time",
                           "per-fork QEMU right after the fork", "per-fork QEMU after a command in each",
                           "target per-fork PSS <= 10% of the parent's RSS"}) {
    EXPECT_NE(r.out.find(line), std::string::npos) << line << " missing in:\n" << r.out;
  }
  auto summary = lastJsonLine(r.out);
  ASSERT_TRUE(summary.is_object()) << r.out;
  EXPECT_EQ(summary["count"], 2);
  // Each copy read the file the source wrote before the fork, and each copy's QEMU was found and measured.
  EXPECT_EQ(summary["copies_with_source_state"], 2) << r.out;
  EXPECT_EQ(summary["failures"], 0) << r.out << r.err;
  EXPECT_GT(summary["parent_rss_mib"].get<double>(), 0);
  EXPECT_GT(summary["fork_pss_mib_after_exec"].get<double>(), 0);
}

}  // namespace
}  // namespace dsec::testing
