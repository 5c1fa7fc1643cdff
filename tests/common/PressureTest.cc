// Pressure sources: PSI, /proc/meminfo and keyed counters parsed from sample text, and read from this machine.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dsec/common/Pressure.h"
#include "dsec/common/Strings.h"
#include "dsec/testing/TestSupport.h"

namespace dsec {
namespace {

TEST(PressureTest, ParsesMemoryPsi) {
  auto psi = parsePsi(
      "some avg10=9.60 avg60=3.10 avg300=0.75 total=1570994\n"
      "full avg10=4.11 avg60=1.00 avg300=0.20 total=492257\n");
  ASSERT_TRUE(psi.ok()) << psi.error().toString();
  EXPECT_DOUBLE_EQ(psi->some.avg10, 9.60);
  EXPECT_DOUBLE_EQ(psi->some.avg60, 3.10);
  EXPECT_DOUBLE_EQ(psi->some.avg300, 0.75);
  EXPECT_EQ(psi->some.total_usec, 1570994u);
  ASSERT_TRUE(psi->has_full);
  EXPECT_DOUBLE_EQ(psi->full.avg10, 4.11);
  EXPECT_EQ(psi->full.total_usec, 492257u);
}

TEST(PressureTest, CpuPsiWithoutFullLine) {
  // Kernels before 5.13 have no "full" line in cpu.pressure.
  auto psi = parsePsi("some avg10=98.33 avg60=3.74 avg300=1.87 total=4347393345\n");
  ASSERT_TRUE(psi.ok());
  EXPECT_FALSE(psi->has_full);
  EXPECT_DOUBLE_EQ(psi->some.avg10, 98.33);
  EXPECT_DOUBLE_EQ(psi->full.avg10, 0);
}

TEST(PressureTest, RejectsBrokenPsi) {
  EXPECT_FALSE(parsePsi("").ok());
  EXPECT_FALSE(parsePsi("full avg10=1.00 avg60=0 avg300=0 total=1\n").ok());  // no some
  EXPECT_FALSE(parsePsi("some avg10=x avg60=0 avg300=0 total=1\n").ok());
  EXPECT_FALSE(parsePsi("some avg10\n").ok());
  EXPECT_FALSE(parsePsi("weird avg10=1\n").ok());
  // Unknown keys are tolerated (a newer kernel may add some).
  EXPECT_TRUE(parsePsi("some avg10=1.00 avg60=0 avg300=0 total=1 avg1=3\n").ok());
}

TEST(PressureTest, ParsesMeminfo) {
  auto m = parseMemInfo(
      "MemTotal:       24684084 kB\nMemFree:        21562624 kB\nMemAvailable:   23227836 kB\n"
      "Buffers:           1234 kB\nCached:          1764864 kB\nSwapCached:            0 kB\n"
      "Shmem:             28756 kB\nSwapTotal:       1048576 kB\nSwapFree:         524288 kB\n"
      "HugePages_Total:       0\n");
  ASSERT_TRUE(m.ok()) << m.error().toString();
  EXPECT_EQ(m->total_bytes, 24684084LL * 1024);
  EXPECT_EQ(m->available_bytes, 23227836LL * 1024);
  EXPECT_EQ(m->free_bytes, 21562624LL * 1024);
  EXPECT_EQ(m->cached_bytes, 1764864LL * 1024);
  EXPECT_EQ(m->shmem_bytes, 28756LL * 1024);
  EXPECT_EQ(m->swap_total_bytes, 1048576LL * 1024);
  EXPECT_EQ(m->swap_free_bytes, 524288LL * 1024);
  EXPECT_EQ(m->used_bytes(), (24684084LL - 23227836LL) * 1024);
  EXPECT_FALSE(parseMemInfo("MemTotal: 1 kB\n").ok());  // MemAvailable missing
}

TEST(PressureTest, KeyedCounters) {
  std::string oom_control = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n";
  EXPECT_EQ(keyedCounter(oom_control, "oom_kill"), 3);
  EXPECT_EQ(keyedCounter(oom_control, "under_oom"), 0);
  EXPECT_FALSE(keyedCounter(oom_control, "oom").has_value());
  EXPECT_EQ(keyedCounter("low 0\nhigh 2\nmax 10\noom 1\noom_kill 1\noom_group_kill 0\n", "max"), 10);
}

TEST(PressureTest, ResolvesPathsOnFakeTrees) {
  testing::TempDir tmp;
  std::string v2 = tmp.path() + "/v2", v1 = tmp.path() + "/v1", none = tmp.path() + "/none";
  ASSERT_TRUE(makeDirs(v2).ok());
  ASSERT_TRUE(writeFile(v2 + "/cgroup.controllers", "cpu memory").ok());
  auto p2 = resolvePressurePaths("dsec", v2, "/proc");
  EXPECT_EQ(p2.cgroup_version, 2);
  EXPECT_TRUE(p2.psi_per_cgroup);
  EXPECT_EQ(p2.memory_psi, v2 + "/dsec/memory.pressure");

  ASSERT_TRUE(makeDirs(v1 + "/memory/dsec").ok());
  ASSERT_TRUE(writeFile(v1 + "/memory/cgroup.procs", "").ok());
  ASSERT_TRUE(writeFile(v1 + "/memory/dsec/memory.usage_in_bytes", "1048576\n").ok());
  ASSERT_TRUE(writeFile(v1 + "/memory/dsec/memory.limit_in_bytes", "9223372036854771712\n").ok());
  ASSERT_TRUE(writeFile(v1 + "/memory/dsec/memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n").ok());
  ASSERT_TRUE(
      writeFile(v1 + "/memory/dsec/memory.stat", "cache 10\ninactive_file 7\ntotal_inactive_file 262144\n").ok());
  ASSERT_TRUE(makeDirs(v1 + "/cpuacct/dsec").ok());
  ASSERT_TRUE(writeFile(v1 + "/cpuacct/dsec/cpuacct.usage", "5000000\n").ok());
  auto p1 = resolvePressurePaths("dsec", v1, "/proc");
  EXPECT_EQ(p1.cgroup_version, 1);
  EXPECT_FALSE(p1.psi_per_cgroup);
  EXPECT_EQ(p1.memory_psi, "/proc/pressure/memory");
  auto s1 = readParentCgroupStats(p1);
  ASSERT_TRUE(s1.ok()) << s1.error().toString();
  EXPECT_TRUE(s1->exists);
  EXPECT_EQ(s1->memory_bytes, 1048576);
  EXPECT_EQ(s1->memory_limit_bytes, 0);  // v1's "unlimited"
  EXPECT_EQ(s1->oom_kills, 2);
  EXPECT_EQ(s1->inactive_file_bytes, 262144);
  EXPECT_EQ(s1->working_set_bytes(), 1048576 - 262144);
  EXPECT_EQ(s1->cpu_usec, 5000u);

  auto absent = readParentCgroupStats(resolvePressurePaths("other", v1, "/proc"));
  ASSERT_TRUE(absent.ok());
  EXPECT_FALSE(absent->exists);

  ASSERT_TRUE(makeDirs(none).ok());
  EXPECT_EQ(resolvePressurePaths("dsec", none, "/proc").cgroup_version, 0);
}

TEST(PressureTest, RealMachine) {
  auto m = readMemInfo();
  ASSERT_TRUE(m.ok()) << m.error().toString();
  EXPECT_GT(m->total_bytes, 0);
  EXPECT_LE(m->available_bytes, m->total_bytes);
  if (::access("/proc/pressure/memory", R_OK) != 0) GTEST_SKIP() << "no /proc/pressure (kernel without PSI, or psi=0)";
  for (const char* f : {"/proc/pressure/memory", "/proc/pressure/cpu", "/proc/pressure/io"}) {
    auto psi = readPsi(f);
    ASSERT_TRUE(psi.ok()) << psi.error().toString();
    EXPECT_GE(psi->some.avg10, 0);
    EXPECT_LE(psi->some.avg10, 100);
  }
  auto mem = readPsi("/proc/pressure/memory");
  ASSERT_TRUE(mem.ok());
  EXPECT_TRUE(mem->has_full);
  // The root cgroup's stats through the same reader as a node's parent: it exists and charges something.
  auto paths = resolvePressurePaths("");
  if (paths.cgroup_version == 0) GTEST_SKIP() << "no memory cgroup controller mounted";
  auto stats = readParentCgroupStats(paths);
  ASSERT_TRUE(stats.ok()) << stats.error().toString();
  EXPECT_TRUE(stats->exists);
}

}  // namespace
}  // namespace dsec
