// Limits: memory (OOM reported, node unaffected), pids (fork bomb), disk (the upper's size), freezer.
#include <gtest/gtest.h>

#include "ContainerTestSupport.h"
#include "dsec/common/Strings.h"

namespace dsec::testing {
namespace {

TEST_F(ContainerTest, MemoryLimitGivesReportedOom) {
  auto spec = makeSpec();
  spec.memory_bytes = 32 << 20;
  auto& sb = create(spec);
  // dd fills a 128 MiB buffer from /dev/zero: far over the limit.
  auto r = sh(sb, "dd if=/dev/zero of=/dev/null bs=128M count=1", 30);
  EXPECT_TRUE(r.oom_killed) << r.stderr_data;
  EXPECT_EQ(r.signal, 9);
  auto usage = sb.usage();
  ASSERT_OK(usage);
  EXPECT_GE(usage->oom_kills, 1);
  EXPECT_EQ(sh(sb, "echo still here").stdout_data, "still here\n");
  EXPECT_FALSE(sh(sb, "true").oom_killed);
}

TEST_F(ContainerTest, PidsLimitStopsForkBomb) {
  auto spec = makeSpec();
  spec.pids = 64;
  auto& sb = create(spec);
  auto r = sh(sb, "f() { f | f & }; f; sleep 2", 4);
  auto usage = sb.usage();
  ASSERT_OK(usage);
  EXPECT_LE(usage->pids, 64);
  ASSERT_OK(sb.destroy());
  EXPECT_TRUE(cgroupDirsOf(spec.id).empty());
}

TEST_F(ContainerTest, DiskQuotaStopsDiskFiller) {
  auto spec = makeSpec();
  spec.disk_bytes = 16 << 20;
  auto& sb = create(spec);
  auto r = sh(sb, "dd if=/dev/zero of=/fill bs=1M count=64", 30);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.stderr_data.find("No space left"), std::string::npos) << r.stderr_data;
  auto df = sh(sb, "df -k / | tail -1");
  auto fields = split(df.stdout_data, ' ');
  std::vector<std::string> nonempty;
  for (auto& f : fields) {
    if (!f.empty()) nonempty.push_back(f);
  }
  ASSERT_GE(nonempty.size(), 2u) << df.stdout_data;
  EXPECT_EQ(nonempty[1], "16384") << df.stdout_data;
  EXPECT_EQ(sh(sb, "rm /fill && echo x > /small && cat /small").stdout_data, "x\n");
}

TEST_F(ContainerTest, PauseFreezesAndResumeThaws) {
  auto& sb = create();
  sh(sb, "(i=0; while true; do i=$((i+1)); echo $i >> /tmp/count; done) > /dev/null 2>&1 &");
  // The loop appends: the file's size grows exactly while it runs.
  auto readCount = [&] {
    auto st = sb.stat("/tmp/count");
    return st.ok() ? st->size : -1;
  };
  // Polls until the size moves past `before` (a loaded machine may take long to schedule the loop).
  auto grows = [&](int64_t before) {
    for (int i = 0; i < 400; ++i) {
      if (readCount() > before) return true;
      usleep(50000);
    }
    return false;
  };
  ASSERT_TRUE(grows(0)) << "the loop never ran";
  ASSERT_OK(sb.pause());
  EXPECT_EQ(sb.state(), backends::SandboxState::kPaused);
  backends::ExecRequest req;
  req.argv = {"true"};
  ASSERT_ERROR(sb.exec(req), ErrorCode::kConflict);
  int64_t a = readCount();
  EXPECT_GT(a, 0);
  usleep(300000);
  EXPECT_EQ(readCount(), a) << "processes kept running while paused";
  ASSERT_OK(sb.resume());
  EXPECT_EQ(sb.state(), backends::SandboxState::kRunning);
  EXPECT_TRUE(grows(a)) << "the loop did not run again after resume";
  EXPECT_EQ(sh(sb, "echo ok").stdout_data, "ok\n");
  // Destroying a paused sandbox works too.
  ASSERT_OK(sb.pause());
  ASSERT_OK(sb.destroy());
  EXPECT_TRUE(cgroupDirsOf(sb.spec().id).empty());
}

}  // namespace
}  // namespace dsec::testing
