// Attack: sandbox root acting as host root. Every sandbox has its own user namespace whose root is an unprivileged
// host id range that no other sandbox uses; the layers keep their ownership inside through idmapped mounts; and the
// kernel's per-user counts of a sandbox are its own, so exhausting them inside takes nothing from host root.
#include <fcntl.h>
#include <poll.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <set>
#include <string>
#include <thread>

#include "../backends/container/ContainerTestSupport.h"
#include "InitProtocol.h"
#include "UserNamespace.h"
#include "dsec/common/Process.h"
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

// Host pids of every process in the pid namespace of init_pid (init included), as /proc lists them now.
std::vector<pid_t> pidsInPidNamespaceOf(pid_t init_pid) {
  std::vector<pid_t> out;
  struct stat ns_of_init {};
  if (::stat(("/proc/" + std::to_string(init_pid) + "/ns/pid").c_str(), &ns_of_init) != 0) return out;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string pid = entry.path().filename();
    struct stat ns {};
    if (pid.find_first_not_of("0123456789") != std::string::npos ||
        ::stat(("/proc/" + pid + "/ns/pid").c_str(), &ns) != 0 || ns.st_ino != ns_of_init.st_ino) {
      continue;
    }
    out.push_back(static_cast<pid_t>(std::stoi(pid)));
  }
  return out;
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
  const pid_t init = a.persistentState().at("init_pid").get<pid_t>();
  int checked = 0;
  for (pid_t pid : pidsInPidNamespaceOf(init)) {
    auto status = readFile("/proc/" + std::to_string(pid) + "/status");
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

// A backend that hands out one host id range only, leased in lease_dir: whoever holds that lease runs the only
// sandbox there can be.
backends::ContainerBackendOptions oneRangeOptions(const std::string& lease_dir) {
  backends::ContainerBackendOptions options;
  options.cgroup_parent = kTestCgroupParent;
  options.id_lease_dir = lease_dir;
  options.id_range_count = 1;
  // No inits started ahead: a pooled init takes a range in the background, so with one range a create that races
  // the pool's refill would find none free. The pool competing for the only range is not what these tests are about.
  options.init_pool_size = 0;
  return options;
}

// pidfds of every process in the pid namespace of the sandbox whose init is init_pid (its init included).
std::vector<UniqueFd> processesOf(pid_t init_pid) {
  std::vector<UniqueFd> out;
  for (pid_t pid : pidsInPidNamespaceOf(init_pid)) {
    if (auto fd = pidfdOpen(pid); fd.ok()) out.push_back(std::move(*fd));
  }
  return out;
}

// Destroys sb while another agent on the node (other, sharing the lease directory) tries again and again to lease
// its host id range; returns how many of the sandbox's processes had not exited yet when that lease was granted.
int processesLeftWhenTheRangeCameFree(backends::Sandbox& sb, const backends::IdRangeOptions& ranges) {
  const pid_t init = sb.persistentState().at("init_pid").get<pid_t>();
  std::vector<UniqueFd> procs = processesOf(init);
  EXPECT_GE(procs.size(), 50u) << "the sandbox's processes were not found from the host";
  backends::IdRangeAllocator other(ranges);
  EXPECT_FALSE(other.acquire().ok()) << "the range of a live sandbox was leased again";
  std::thread destroyer([&] { EXPECT_OK(sb.destroy()); });
  int left = -1;
  const double deadline = monotonicSeconds() + 30;
  while (monotonicSeconds() < deadline) {
    auto lease = other.acquire();
    if (!lease.ok()) continue;
    left = 0;
    for (const auto& fd : procs) {
      pollfd p{fd.get(), POLLIN, 0};
      if (::poll(&p, 1, 0) == 0) ++left;  // not exited: it still runs (or may) with the range's ids
    }
    break;
  }
  destroyer.join();
  EXPECT_GE(left, 0) << "the range never came free after the sandbox was destroyed";
  return left;
}

// Many processes, so that the kernel takes a while to kill and reap them all once the sandbox's init is gone.
constexpr const char* kManyProcesses = "i=0; while [ $i -lt 100 ]; do sleep 1000 >/dev/null 2>&1 & i=$((i+1)); done";

// Attack: a sandbox ends with many processes alive, so that its pid namespace takes a while to empty after its init
// dies. Another agent on the node must not be given the sandbox's host id range before then: a new sandbox would
// run as the same host ids as processes of the old one.
TEST_F(ContainerTest, AnIdRangeComesFreeOnlyOnceEveryProcessOfItsSandboxIsGone) {
  TempDir dir;
  auto options = oneRangeOptions(dir.path() + "/leases");
  backends::IdRangeOptions ranges;
  ranges.lease_dir = options.id_lease_dir;
  ranges.count = 1;
  auto backend = backends::makeContainerBackend(options);
  ASSERT_OK(backend);
  for (int round = 0; round < 3; ++round) {
    auto sb = (*backend)->create(makeSpec());
    ASSERT_OK(sb);
    auto r = sh(**sb, kManyProcesses);
    ASSERT_EQ(r.exit_code, 0) << r.stderr_data;
    EXPECT_EQ(processesLeftWhenTheRangeCameFree(**sb, ranges), 0) << "round " << round;
  }
}

// A node at its last free id range while its init pool refills: the pool's init-in-progress holds that range, and a
// create that finds none free for an init of its own takes the pool's instead of being refused.
TEST_F(ContainerTest, ACreateAtTheLastFreeRangeTakesTheInitThePoolIsStartingWithIt) {
  TempDir dir;
  auto options = oneRangeOptions(dir.path() + "/leases");
  options.init_pool_size = 1;
  auto backend = backends::makeContainerBackend(options);
  ASSERT_OK(backend);
  for (int round = 0; round < 20; ++round) {
    auto sb = (*backend)->create(makeSpec());
    SCOPED_TRACE("round " + std::to_string(round));
    ASSERT_OK(sb);
    EXPECT_EQ(sh(**sb, "echo ok").stdout_data, "ok\n");
    ASSERT_OK((*sb)->destroy());
  }
}

// The same across an agent restart: the agent that adopts the sandbox holds its range as the one that made it did.
TEST_F(ContainerTest, AnAdoptedSandboxKeepsItsIdRangeUntilEveryProcessIsGone) {
  TempDir dir;
  auto options = oneRangeOptions(dir.path() + "/leases");
  backends::IdRangeOptions ranges;
  ranges.lease_dir = options.id_lease_dir;
  ranges.count = 1;
  for (int round = 0; round < 3; ++round) {
    nlohmann::json state;
    {
      auto backend = backends::makeContainerBackend(options);
      ASSERT_OK(backend);
      auto sb = (*backend)->create(makeSpec());
      ASSERT_OK(sb);
      auto r = sh(**sb, kManyProcesses);
      ASSERT_EQ(r.exit_code, 0) << r.stderr_data;
      state = (*sb)->persistentState();
      // The handle and the backend go away as in an agent restart; the sandbox lives on.
    }
    auto backend = backends::makeContainerBackend(options);
    ASSERT_OK(backend);
    auto adopted = (*backend)->adopt(state);
    ASSERT_OK(adopted);
    // Its range is still taken: the restarted agent may not give it to a new sandbox of its own either.
    auto spec = makeSpec();
    auto second = (*backend)->create(spec);
    EXPECT_FALSE(second.ok()) << "a second sandbox got the only range while the adopted one lives";
    if (second.ok()) EXPECT_OK((*second)->destroy());
    EXPECT_EQ(processesLeftWhenTheRangeCameFree(**adopted, ranges), 0) << "round " << round;
  }
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
  // Its init gone (its lock with it) while the agent still holds the range: still taken.
  third->init_fd.reset();
  EXPECT_FALSE(b.acquire().ok()) << "a range came free while the agent that leased it still held it";
  third->hold.reset();  // its sandbox is gone
  auto again = b.acquire();
  ASSERT_OK(again);
  EXPECT_EQ(again->host_base, third->host_base);
}

TEST(IdRanges, HoldingManyRangesCostsTheAgentOneFdPerLeaseFile) {
  DSEC_SKIP_UNLESS_ROOT();
  TempDir dir;
  backends::IdRangeOptions options;
  options.lease_dir = dir.path() + "/leases";
  options.count = 300;
  backends::IdRangeAllocator agent(options), other(options);
  ASSERT_OK(agent.prepare());
  auto fds = [] { return std::distance(std::filesystem::directory_iterator("/proc/self/fd"), {}); };
  const auto before = fds();
  std::vector<backends::IdRangeLease> held;
  for (int i = 0; i < 200; ++i) {
    auto lease = agent.acquire();
    ASSERT_OK(lease);
    lease->init_fd.reset();  // its init's (gone here: the agent's hold alone keeps the range)
    held.push_back(std::move(*lease));
  }
  // 200 ranges live in 4 lease files of 64.
  EXPECT_LE(fds() - before, 4);
  // Each is still taken for anyone else; the 100 others are free.
  std::set<uint32_t> mine;
  for (const auto& l : held) mine.insert(l.host_base);
  std::vector<backends::IdRangeLease> theirs;
  for (int i = 0; i < 100; ++i) {
    auto lease = other.acquire();
    ASSERT_OK(lease);
    EXPECT_EQ(mine.count(lease->host_base), 0u) << "range " << lease->host_base << " leased twice";
    theirs.push_back(std::move(*lease));
  }
  EXPECT_FALSE(other.acquire().ok()) << "a range beyond the 300";
}

// A stand-in for a sandbox's init: a child holding fd as its lease fd until it is killed.
class FakeInit {
 public:
  explicit FakeInit(int fd) {
    int ready[2];
    if (::pipe2(ready, O_CLOEXEC) != 0) return;
    UniqueFd ready_r(ready[0]), ready_w(ready[1]);
    pid_ = ::fork();
    if (pid_ == 0) {
      if (::dup2(fd, backends::init_protocol::kLeaseFd) < 0) _exit(1);
      (void)!::write(ready_w.get(), "r", 1);
      for (;;) ::pause();
    }
    ready_w.reset();
    char c;
    (void)!::read(ready_r.get(), &c, 1);  // it holds the fd now
    if (pid_ > 0) pidfd_ = std::move(pidfdOpen(pid_).value());
  }
  ~FakeInit() { kill(); }
  int pidfd() const { return pidfd_.get(); }
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    while (::waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
  UniqueFd pidfd_;
};

TEST(IdRanges, AnAdoptingAgentTakesBackItsInitsLeaseAndNoOneElses) {
  DSEC_SKIP_UNLESS_ROOT();
  TempDir dir;
  backends::IdRangeOptions options;
  options.lease_dir = dir.path() + "/leases";
  options.count = 1;
  backends::IdRangeAllocator first(options);
  ASSERT_OK(first.prepare());
  auto made = first.acquire();
  ASSERT_OK(made);
  const uint32_t base = made->host_base;
  FakeInit init(made->init_fd.get());
  made->init_fd.reset();
  made->hold.reset();  // the agent that made the sandbox is gone; its init holds the range
  EXPECT_FALSE(first.acquire().ok()) << "the range came free while the sandbox's init held it";

  backends::IdRangeAllocator restarted(options);
  auto adopted = restarted.adopt(base, init.pidfd());
  ASSERT_OK(adopted);
  EXPECT_EQ(adopted->host_base, base);
  // The init's end: the range stays leased as long as the adopting agent has not let go.
  init.kill();
  EXPECT_FALSE(restarted.acquire().ok()) << "the range came free with the init while the agent still held it";
  adopted->hold.reset();
  auto other = restarted.acquire();  // now another sandbox's
  ASSERT_OK(other);

  // A process claiming the range without holding its lease is not given it.
  UniqueFd devnull(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  FakeInit impostor(devnull.get());
  ASSERT_ERROR(restarted.adopt(base, impostor.pidfd()), ErrorCode::kConflict);
  // Nor is a host id that is no range of these options.
  ASSERT_ERROR(restarted.adopt(base + 1, impostor.pidfd()), ErrorCode::kNotFound);
}

}  // namespace
}  // namespace dsec::testing
