// spawn() (long-running processes with the caller's pipes), read_only_root and setMemoryLimit: what fncall
// workers are built on.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ContainerTestSupport.h"
#include "dsec/common/Strings.h"

namespace dsec::testing {
namespace {

// Reads from fd until `want` shows up, EOF, or the timeout.
std::string readUntil(int fd, const std::string& want, double timeout = 20) {
  std::string got;
  const double deadline = monotonicSeconds() + timeout;
  char buf[4096];
  while (got.find(want) == std::string::npos && monotonicSeconds() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;
    ssize_t n = read(fd, buf, sizeof buf);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  return got;
}

void writeAll(int fd, const std::string& s) {
  ASSERT_EQ(write(fd, s.data(), s.size()), static_cast<ssize_t>(s.size()));
}

bool waitExit(int pidfd, double timeout) {
  pollfd p{pidfd, POLLIN, 0};
  return poll(&p, 1, static_cast<int>(timeout * 1000)) == 1;
}

void reap(int pidfd) {
  siginfo_t info{};
  waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(pidfd), &info, WEXITED);
}

// The restriction lines of /proc/self/status that must match between exec and spawn.
std::string restrictions(const std::string& status) {
  std::string out;
  for (const auto& line : split(status, '\n')) {
    for (const char* key : {"CapEff:", "CapBnd:", "CapPrm:", "NoNewPrivs:", "Seccomp:"}) {
      if (startsWith(line, key)) out += line + "\n";
    }
  }
  return out;
}

TEST_F(ContainerTest, SpawnRunsInsideWithTheSameRestrictionsAsExec) {
  auto spec = makeSpec();
  auto& sb = create(spec);
  backends::ExecRequest req;
  req.argv = {"/bin/sh", "-c",
              "read x; echo got:$x; echo to-stderr >&2; hostname; cat /proc/self/status; echo pid:$$; echo END; "
              "read y; echo bye:$y"};
  req.cwd = "/tmp";
  auto proc = sb.spawn(req);
  ASSERT_OK(proc);
  ASSERT_GT(proc->pid, 0);
  writeAll(proc->stdin_fd.get(), "hello\n");
  std::string out = readUntil(proc->stdout_fd.get(), "END\n");
  EXPECT_NE(out.find("got:hello\n"), std::string::npos) << out;
  EXPECT_NE(out.find(spec.id + "\n"), std::string::npos) << "hostname is the sandbox id: " << out;
  EXPECT_EQ(readUntil(proc->stderr_fd.get(), "to-stderr\n"), "to-stderr\n");
  // In the sandbox's pid namespace (its pid there is not the host pid) and cgroup.
  EXPECT_EQ(out.find("pid:" + std::to_string(proc->pid) + "\n"), std::string::npos) << out;
  auto cgroups = readFile("/proc/" + std::to_string(proc->pid) + "/cgroup");
  ASSERT_OK(cgroups);
  EXPECT_NE(cgroups->find(spec.id), std::string::npos) << *cgroups;
  // Same capabilities, no_new_privs and seccomp as an exec.
  auto exec_status = sh(sb, "cat /proc/self/status");
  std::string want = restrictions(exec_status.stdout_data);
  EXPECT_NE(want.find("Seccomp:\t2"), std::string::npos) << want;
  EXPECT_EQ(restrictions(out), want);
  // Still running until we say so; then it exits and is ours to reap.
  EXPECT_FALSE(waitExit(proc->pidfd.get(), 0.1));
  writeAll(proc->stdin_fd.get(), "now\n");
  EXPECT_NE(readUntil(proc->stdout_fd.get(), "bye:now\n").find("bye:now"), std::string::npos);
  ASSERT_TRUE(waitExit(proc->pidfd.get(), 20));
  reap(proc->pidfd.get());
}

TEST_F(ContainerTest, SpawnedProcessDiesWithTheSandbox) {
  auto spec = makeSpec();
  auto& sb = create(spec);
  backends::ExecRequest req;
  req.argv = {"sleep", "1000"};
  auto proc = sb.spawn(req);
  ASSERT_OK(proc);
  ASSERT_OK(sb.destroy());
  ASSERT_TRUE(waitExit(proc->pidfd.get(), 20));
  reap(proc->pidfd.get());
  EXPECT_TRUE(cgroupDirsOf(spec.id).empty());
  EXPECT_EQ(sandboxMountsInHost(spec.id), 0u);
}

TEST_F(ContainerTest, SpawnErrors) {
  auto& sb = create();
  backends::ExecRequest req;
  req.argv = {"/no/such/program"};
  ASSERT_ERROR(sb.spawn(req), ErrorCode::kNotFound);
  req.argv = {};
  ASSERT_ERROR(sb.spawn(req), ErrorCode::kInvalidArgument);
  ASSERT_OK(sb.destroy());
  req.argv = {"true"};
  ASSERT_ERROR(sb.spawn(req), ErrorCode::kNotFound);
}

class ReadOnlyRootTest : public ContainerTest {
 protected:
  // Size in KiB of the file system holding dir, as df inside the sandbox shows it.
  std::string dfKilobytes(backends::Sandbox& sb, const std::string& dir) {
    auto df = sh(sb, "df -k " + dir + " | tail -1");
    std::vector<std::string> fields;
    for (auto& f : split(df.stdout_data, ' ')) {
      if (!f.empty()) fields.push_back(f);
    }
    return fields.size() >= 2 ? fields[1] : "?" + df.stdout_data;
  }
};

TEST_F(ReadOnlyRootTest, RootIsReadOnlyAndOnlyTmpfsDirsAreWritable) {
  auto spec = makeSpec();
  spec.read_only_root = true;
  spec.disk_bytes = 8 << 20;
  auto& sb = create(spec);
  EXPECT_EQ(sh(sb, "cat /layer-file").stdout_data, "from the layer\n");
  for (const char* path : {"/x", "/bin/x", "/etc/passwd", "/root/x"}) {
    auto r = sh(sb, std::string("echo x > ") + path);
    EXPECT_NE(r.exit_code, 0) << path;
    EXPECT_NE(r.stderr_data.find("Read-only file system"), std::string::npos) << path << ": " << r.stderr_data;
  }
  EXPECT_NE(sh(sb, "mkdir /newdir").exit_code, 0);
  for (const char* dir : {"/tmp", "/work", "/dev/shm"}) {
    auto r = sh(sb, std::string("echo x > ") + dir + "/f && cat " + dir + "/f");
    EXPECT_EQ(r.stdout_data, "x\n") << dir << ": " << r.stderr_data;
    EXPECT_EQ(dfKilobytes(sb, dir), "8192") << dir;
  }
  // Each writable dir is bounded by disk_bytes.
  auto fill = sh(sb, "dd if=/dev/zero of=/tmp/fill bs=1M count=32", 30);
  EXPECT_NE(fill.exit_code, 0);
  EXPECT_NE(fill.stderr_data.find("No space left"), std::string::npos) << fill.stderr_data;
  // The ipc namespace's POSIX message queues are visible (a worker can wipe them).
  EXPECT_NE(sh(sb, "grep mqueue /proc/mounts").stdout_data.find("/dev/mqueue"), std::string::npos);
  EXPECT_EQ(sh(sb, "stat -c %a /tmp /dev/shm").stdout_data, "1777\n1777\n");
  ASSERT_OK(sb.destroy());
  EXPECT_TRUE(cgroupDirsOf(spec.id).empty());
  EXPECT_EQ(sandboxMountsInHost(spec.id), 0u);
}

TEST_F(ReadOnlyRootTest, ReadOnlyRootExcludesHostUpperDir) {
  TempDir upper;
  auto spec = makeSpec();
  spec.read_only_root = true;
  spec.upper_dir = upper.path();
  auto sb = backend_->create(spec);
  ASSERT_FALSE(sb.ok());
  EXPECT_NE(sb.error().message().find("read_only_root"), std::string::npos) << sb.error().toString();
  EXPECT_TRUE(cgroupDirsOf(spec.id).empty());
}

std::string hostMemoryLimit(const std::string& id) {
  for (const auto& dir : cgroupDirsOf(id)) {
    for (const char* f : {"/memory.limit_in_bytes", "/memory.max"}) {
      auto v = readFile(dir + f);
      if (v.ok()) return trim(*v);
    }
  }
  return "";
}

TEST_F(ContainerTest, SetMemoryLimitChangesTheLimitBothWays) {
  auto spec = makeSpec();
  spec.memory_bytes = 64 << 20;
  auto& sb = create(spec);
  EXPECT_EQ(hostMemoryLimit(spec.id), std::to_string(64 << 20));
  ASSERT_OK(sb.setMemoryLimit(512 << 20));  // up: on v1 memsw must be raised first
  EXPECT_EQ(hostMemoryLimit(spec.id), std::to_string(512 << 20));
  ASSERT_OK(sb.setMemoryLimit(48 << 20));  // down
  EXPECT_EQ(hostMemoryLimit(spec.id), std::to_string(48 << 20));
  // The new limit is enforced.
  auto r = sh(sb, "dd if=/dev/zero of=/dev/null bs=96M count=1", 30);
  EXPECT_TRUE(r.oom_killed) << r.stderr_data;
  EXPECT_EQ(sh(sb, "echo ok").stdout_data, "ok\n");
  ASSERT_ERROR(sb.setMemoryLimit(-1), ErrorCode::kInvalidArgument);
}

TEST_F(ContainerTest, SetMemoryLimitBelowUsageIsRefusedOnV1) {
  if (access("/sys/fs/cgroup/memory/memory.limit_in_bytes", F_OK) != 0) {
    GTEST_SKIP() << "cgroup v2 takes a limit below usage (and reclaims or OOM-kills); the refusal is v1's";
  }
  auto spec = makeSpec();
  spec.memory_bytes = 128 << 20;
  auto& sb = create(spec);
  // tmpfs pages of a sandbox without swap room cannot be reclaimed below this.
  auto fill = sh(sb, "dd if=/dev/zero of=/dev/shm/keep bs=1M count=40 2>&1");
  ASSERT_EQ(fill.exit_code, 0) << fill.stdout_data;
  ASSERT_ERROR(sb.setMemoryLimit(16 << 20), ErrorCode::kResourceExhausted);
  EXPECT_EQ(sh(sb, "echo alive").stdout_data, "alive\n");
  ASSERT_OK(sb.setMemoryLimit(256 << 20));
}

}  // namespace
}  // namespace dsec::testing
