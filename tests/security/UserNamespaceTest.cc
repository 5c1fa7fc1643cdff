// Attack: sandbox root acting as host root. Every sandbox has its own user namespace whose root is an unprivileged
// host id range that no other sandbox uses; the layers keep their ownership inside through idmapped mounts; and the
// kernel's per-user counts of a sandbox are its own, so exhausting them inside takes nothing from host root.
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <set>
#include <string>

#include "../backends/container/ContainerTestSupport.h"
#include "UserNamespace.h"
#include "dsec/common/Strings.h"

namespace dsec::testing {
namespace {

// The host uid of the root of a sandbox's user namespace, from its uid_map ("0 BASE 65536").
uint64_t hostRootOf(backends::Sandbox& sb, const std::function<backends::ExecResult(const std::string&)>& sh) {
  auto r = sh("cat /proc/self/uid_map");
  std::vector<std::string> fields;
  for (auto& f : split(trim(r.stdout_data), ' ')) {
    if (!f.empty()) fields.push_back(f);
  }
  (void)sb;
  if (fields.size() != 3 || fields[0] != "0") {
    ADD_FAILURE() << "uid_map: " << r.stdout_data;
    return 0;
  }
  EXPECT_EQ(fields[2], "65536");
  return std::stoull(fields[1]);
}

TEST_F(ContainerTest, SandboxRootIsAnUnprivilegedHostIdRangeOfItsOwn) {
  auto& a = create();
  auto& b = create();
  uint64_t base_a = hostRootOf(a, [&](const std::string& c) { return sh(a, c); });
  uint64_t base_b = hostRootOf(b, [&](const std::string& c) { return sh(b, c); });
  EXPECT_GE(base_a, 65536u) << "sandbox root maps to a host login or system id";
  EXPECT_GE(base_b, 65536u);
  EXPECT_TRUE(base_a + 65536 <= base_b || base_b + 65536 <= base_a) << base_a << " and " << base_b << " overlap";
  // Seen from the host, every process of the sandbox (its init and a command left running) runs as the range's
  // root, not as 0.
  sh(a, "sleep 30 >/dev/null 2>&1 &");
  const std::string init = std::to_string(a.persistentState().at("init_pid").get<int>());
  struct stat ns_of_init {};
  ASSERT_EQ(::stat(("/proc/" + init + "/ns/pid").c_str(), &ns_of_init), 0);
  int checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string pid = entry.path().filename();
    struct stat ns {};
    if (pid.find_first_not_of("0123456789") != std::string::npos ||
        ::stat(("/proc/" + pid + "/ns/pid").c_str(), &ns) != 0 || ns.st_ino != ns_of_init.st_ino) {
      continue;
    }
    auto status = readFile("/proc/" + pid + "/status");
    if (!status.ok()) continue;
    for (const auto& line : split(*status, '\n')) {
      if (!startsWith(line, "Uid:")) continue;
      EXPECT_EQ(line, "Uid:\t" + std::to_string(base_a) + "\t" + std::to_string(base_a) + "\t" +
                          std::to_string(base_a) + "\t" + std::to_string(base_a))
          << "process " << pid;
      ++checked;
    }
  }
  EXPECT_GE(checked, 2) << "the sandbox's init and its sleep were not found from the host";
}

TEST_F(ContainerTest, LayersAndUpperKeepTheirOwnershipInside) {
  auto& sb = create();
  auto r = sh(sb,
              "stat -c %u:%g /bin/busybox / /etc; echo x > /etc/made && stat -c %u:%g /etc/made; "
              "chown 1000:1000 /etc/made && stat -c %u:%g /etc/made");
  EXPECT_EQ(r.stdout_data, "0:0\n0:0\n0:0\n0:0\n1000:1000\n") << r.stderr_data;
  // A file the API writes belongs to the sandbox's root too.
  {
    auto fd = sb.openForWrite("/work/api/file.txt", 0644);
    ASSERT_OK(fd);
    ASSERT_EQ(::write(fd->get(), "hi", 2), 2);
  }
  r = sh(sb, "stat -c %u:%g /work/api /work/api/file.txt && echo more >> /work/api/file.txt && cat /work/api/file.txt");
  EXPECT_EQ(r.stdout_data, "0:0\n0:0\nhimore\n") << r.stderr_data;
}

TEST_F(ContainerTest, ExhaustingPerUserKernelLimitsInsideTakesNothingFromHostRoot) {
  auto limit = readFile("/proc/sys/fs/inotify/max_user_instances");
  ASSERT_OK(limit);
  const int max = std::stoi(trim(*limit));
  if (max > 4096) GTEST_SKIP() << "fs.inotify.max_user_instances is " << max << ": too high to exhaust in a test";
  auto& sb = create();
  auto hog = readFile(DSEC_TEST_INOTIFY_HOG);
  ASSERT_OK(hog);
  {
    auto fd = sb.openForWrite("/tmp/hog", 0755);
    ASSERT_OK(fd);
    ASSERT_EQ(::write(fd->get(), hog->data(), hog->size()), static_cast<ssize_t>(hog->size()));
  }
  // It takes instances until the kernel says no, then holds them.
  auto r = sh(sb,
              "/tmp/hog > /tmp/hog.out 2>&1 & n=0; while [ ! -s /tmp/hog.out ] && [ $n -lt 600 ]; do "
              "sleep 0.1; n=$((n+1)); done; cat /tmp/hog.out",
              120);
  int held = 0, err = 0;
  ASSERT_EQ(sscanf(r.stdout_data.c_str(), "held %d errno %d", &held, &err), 2) << r.stdout_data << r.stderr_data;
  EXPECT_EQ(err, EMFILE) << "the hog stopped for another reason than the per-user limit";
  EXPECT_GE(held, max / 2) << "the sandbox could not even use its own inotify instances";
  // Host root (this process) can still make one: the sandbox's instances were charged to its own host ids.
  int fd = inotify_init1(IN_CLOEXEC);
  EXPECT_GE(fd, 0) << "host root lost its inotify instances to a sandbox: " << strerror(errno);
  if (fd >= 0) close(fd);
}

TEST_F(ContainerTest, RootInsideHasNoPrivilegeOverTheHostsFiles) {
  auto& sb = create();
  // The host's files are not in the sandbox at all; what the sandbox shares with the host (the layer, the device
  // nodes bound in) is owned by ids its root does not hold, or read-only.
  auto r = sh(sb,
              "echo x > /dev/null && echo devnull-ok; "
              "mknod /tmp/disk b 8 0 2>&1 || echo mknod-refused; "
              "touch /proc/sys/kernel/core_pattern 2>&1 || echo sysctl-refused; "
              "cat /proc/self/status | grep -E '^(CapEff|NoNewPrivs|Seccomp):'");
  EXPECT_NE(r.stdout_data.find("devnull-ok"), std::string::npos) << r.stdout_data << r.stderr_data;
  EXPECT_NE(r.stdout_data.find("mknod-refused"), std::string::npos) << r.stdout_data;
  EXPECT_NE(r.stdout_data.find("sysctl-refused"), std::string::npos) << r.stdout_data;
  EXPECT_NE(r.stdout_data.find("NoNewPrivs:\t1"), std::string::npos) << r.stdout_data;
  EXPECT_NE(r.stdout_data.find("Seccomp:\t2"), std::string::npos) << r.stdout_data;
}

TEST(IdRanges, RefusedWhenAHostUsersSubordinateIdsOverlapThem) {
  DSEC_SKIP_UNLESS_ROOT();  // the lease directory must be root's
  TempDir dir;
  const std::string subuid = dir.path() + "/subuid";
  backends::IdRangeOptions options;
  options.lease_dir = dir.path() + "/leases";
  options.subordinate_id_files = {subuid};
  ASSERT_OK(writeFile(subuid, "alice:100000:65536\n"));
  ASSERT_OK(backends::IdRangeAllocator(options).prepare());
  // A user who holds ids a sandbox's root may map to could signal or ptrace that sandbox's processes.
  ASSERT_OK(
      writeFile(subuid, "alice:100000:65536\nmallory:" + std::to_string(options.first_host_id + 70000) + ":65536\n"));
  auto refused = backends::IdRangeAllocator(options).prepare();
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message().find("mallory"), std::string::npos) << refused.error().message();
}

TEST(IdRanges, NoTwoLeasesShareARange) {
  DSEC_SKIP_UNLESS_ROOT();
  TempDir dir;
  backends::IdRangeOptions options;
  options.lease_dir = dir.path() + "/leases";
  options.count = 3;
  backends::IdRangeAllocator a(options), b(options);  // two agents on one node
  ASSERT_OK(a.prepare());
  auto first = a.acquire();
  auto second = b.acquire();
  auto third = a.acquire();
  ASSERT_OK(first);
  ASSERT_OK(second);
  ASSERT_OK(third);
  std::set<uint32_t> bases = {first->host_base, second->host_base, third->host_base};
  EXPECT_EQ(bases.size(), 3u);
  EXPECT_FALSE(b.acquire().ok()) << "a fourth lease out of three ranges";
  third->lock_fd.reset();  // its sandbox is gone
  auto again = b.acquire();
  ASSERT_OK(again);
  EXPECT_EQ(again->host_base, third->host_base);
}

}  // namespace
}  // namespace dsec::testing
