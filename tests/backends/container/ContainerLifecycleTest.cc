// Create/destroy leave nothing behind (also when a create fails at any step); adoption after an agent
// restart; reaping; concurrency. Prints create latency for information (no timing asserts).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <thread>

#include "ContainerTestSupport.h"
#include "dsec/common/Fault.h"
#include "dsec/common/Strings.h"

namespace dsec::testing {
namespace {

std::string mountNamespaceOf(const std::string& pid) {
  char link[128] = {};
  ssize_t n = readlink(("/proc/" + pid + "/ns/mnt").c_str(), link, sizeof link - 1);
  return n > 0 ? std::string(link, static_cast<size_t>(n)) : "";
}

// Children left behind: anything exited but unreaped, or anything past being an idle pooled init. The
// backend keeps a few inits waiting for their config; they are its children but still share our mount
// namespace, while every init that got a config (and every command) has the sandbox's own.
bool hasChildren() {
  siginfo_t info{};
  if (waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid != 0) return true;
  const std::string ours = mountNamespaceOf("self");
  size_t idle = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
    auto children = readFile(entry.path().string() + "/children");
    if (!children.ok()) continue;
    for (const auto& pid : split(trim(*children), ' ')) {
      if (pid.empty()) continue;
      // The backend's one command spawner lives as long as the backend.
      auto comm = readFile("/proc/" + pid + "/comm");
      if (comm.ok() && trim(*comm) == "dsec-sandbox-sp") continue;
      std::string theirs = mountNamespaceOf(pid);
      if (!theirs.empty() && theirs != ours) return true;
      ++idle;
    }
  }
  return idle > static_cast<size_t>(backends::ContainerBackendOptions{}.init_pool_size);
}

// What a sandbox left is left for good; the init pool refilling in the background (an init starting, a first
// stage exiting) is not: check until the pool is still, for a few seconds at most.
bool childrenLeftBehind() {
  const double deadline = monotonicSeconds() + 10;
  while (hasChildren()) {
    if (monotonicSeconds() > deadline) return true;
    usleep(20000);
  }
  return false;
}

pid_t initPid(const backends::Sandbox& sb) { return sb.persistentState().at("init_pid").get<pid_t>(); }

TEST_F(ContainerTest, NothingLeftAfterDestroy) {
  auto spec = makeSpec();
  auto& sb = create(spec);
  pid_t init = initPid(sb);
  sh(sb, "sleep 1000 & sleep 1000 & echo x > /tmp/f");
  EXPECT_FALSE(cgroupDirsOf(spec.id).empty());
  EXPECT_EQ(sandboxMountsInHost(spec.id), 0u) << "per-sandbox mounts leaked into the host namespace";
  ASSERT_OK(sb.destroy());
  EXPECT_TRUE(cgroupDirsOf(spec.id).empty());
  EXPECT_FALSE(processAlive(init));
  EXPECT_FALSE(childrenLeftBehind());
  EXPECT_EQ(sandboxMountsInHost(spec.id), 0u);
}

TEST_F(ContainerTest, NothingLeftAfterFailedCreateAtEachStep) {
  auto points = backends::containerCreateFaultPoints();
  ASSERT_GE(points.size(), 15u);
  std::vector<std::string> failed_ids;
  for (const auto& point : points) {
    SCOPED_TRACE(point);
    auto spec = makeSpec();
    failed_ids.push_back(spec.id);
    armFault(point);
    auto sb = backend_->create(spec);
    armFault("");
    ASSERT_FALSE(sb.ok()) << "create succeeded with fault " << point;
    EXPECT_NE(sb.error().message().find(point.substr(point.rfind('.') + 1)), std::string::npos)
        << sb.error().toString();
    EXPECT_TRUE(cgroupDirsOf(spec.id).empty());
    EXPECT_FALSE(childrenLeftBehind());
    EXPECT_EQ(sandboxMountsInHost(spec.id), 0u);
  }
  auto leftovers = backend_->listLeftovers();
  ASSERT_OK(leftovers);
  for (const auto& id : failed_ids) {
    EXPECT_EQ(std::find(leftovers->begin(), leftovers->end(), id), leftovers->end()) << id;
  }
  // And the backend still works afterwards.
  auto& sb = create();
  EXPECT_EQ(sh(sb, "echo ok").stdout_data, "ok\n");
}

TEST_F(ContainerTest, BadSpecsAreRejected) {
  auto spec = makeSpec();
  spec.id = "../x";
  ASSERT_ERROR(backend_->create(spec), ErrorCode::kInvalidArgument);
  spec = makeSpec();
  spec.lower_dirs = {"/does/not/exist"};
  ASSERT_ERROR(backend_->create(spec), ErrorCode::kInvalidArgument);
  spec = makeSpec();
  spec.lower_dirs = {};
  ASSERT_ERROR(backend_->create(spec), ErrorCode::kInvalidArgument);
  spec = makeSpec();
  spec.memory_bytes = -1;
  ASSERT_ERROR(backend_->create(spec), ErrorCode::kInvalidArgument);
  spec = makeSpec();
  auto& sb = create(spec);
  (void)sb;
  ASSERT_ERROR(backend_->create(spec), ErrorCode::kAlreadyExists);
}

TEST_F(ContainerTest, AdoptAfterAgentRestart) {
  auto spec = makeSpec();
  nlohmann::json state;
  {
    auto sb = backend_->create(spec);
    ASSERT_OK(sb);
    sh(**sb, "sleep 1000 & echo kept > /tmp/kept");
    state = (*sb)->persistentState();
    // The handle and the backend go away as in an agent restart; the sandbox must not.
  }
  backend_.reset();
  backend_ = newBackend();
  auto leftovers = backend_->listLeftovers();
  ASSERT_OK(leftovers);
  EXPECT_NE(std::find(leftovers->begin(), leftovers->end(), spec.id), leftovers->end());

  // A record of another backend is not taken for this one's, however container-like it looks.
  nlohmann::json foreign = state;
  foreign["backend"] = "simulated";
  ASSERT_ERROR(backend_->adopt(foreign), ErrorCode::kInvalidArgument);
  auto adopted = backend_->adopt(nlohmann::json::parse(state.dump()));
  ASSERT_OK(adopted);
  auto& sb = **adopted;
  EXPECT_EQ(sb.spec().id, spec.id);
  EXPECT_EQ(sb.spec().lower_dirs, spec.lower_dirs);
  auto r = sh(sb, "cat /tmp/kept; ps -o args | grep -v grep | grep -c 'sleep 1000'");
  EXPECT_EQ(r.stdout_data, "kept\n1\n");
  leftovers = backend_->listLeftovers();
  ASSERT_OK(leftovers);
  EXPECT_EQ(std::find(leftovers->begin(), leftovers->end(), spec.id), leftovers->end());
  pid_t init = initPid(sb);
  ASSERT_OK(sb.destroy());
  EXPECT_FALSE(processAlive(init));
  EXPECT_TRUE(cgroupDirsOf(spec.id).empty());
  ASSERT_ERROR(backend_->adopt(state), ErrorCode::kNotFound);
  ASSERT_OK(backend_->reap(state));
}

TEST_F(ContainerTest, ReapWhatCannotBeAdopted) {
  auto spec = makeSpec();
  nlohmann::json state;
  pid_t init;
  {
    auto sb = backend_->create(spec);
    ASSERT_OK(sb);
    sh(**sb, "sleep 1000 &");
    state = (*sb)->persistentState();
    init = initPid(**sb);
  }
  // A state whose init start time does not match (pid reused): not adoptable, and reap must not kill the pid.
  nlohmann::json stale = state;
  stale["init_start_time"] = state["init_start_time"].get<uint64_t>() + 1;
  ASSERT_ERROR(backend_->adopt(stale), ErrorCode::kNotFound);
  ASSERT_OK(backend_->reap(stale));  // kills via the cgroup
  EXPECT_TRUE(cgroupDirsOf(spec.id).empty());
  // The init was in the cgroup and is gone; it was our child: reap the zombie.
  waitpid(init, nullptr, 0);
  EXPECT_FALSE(processAlive(init));

  // A leftover cgroup without any state.
  auto other = makeSpec();
  {
    auto sb = backend_->create(other);
    ASSERT_OK(sb);
    init = initPid(**sb);
  }
  auto leftovers = backend_->listLeftovers();
  ASSERT_OK(leftovers);
  ASSERT_NE(std::find(leftovers->begin(), leftovers->end(), other.id), leftovers->end());
  ASSERT_OK(backend_->reapLeftover(other.id));
  waitpid(init, nullptr, 0);
  EXPECT_FALSE(processAlive(init));
  EXPECT_TRUE(cgroupDirsOf(other.id).empty());
}

TEST_F(ContainerTest, HostUpperDirKeepsChanges) {
  TempDir upper;
  auto spec = makeSpec();
  spec.upper_dir = upper.path();
  auto& sb = create(spec);
  auto r = sh(sb, "echo built > /built.txt && rm /layer-file && echo ok");
  EXPECT_EQ(r.stdout_data, "ok\n") << r.stderr_data;
  ASSERT_OK(sb.destroy());
  auto built = readFile(upper.path() + "/upper/built.txt");
  ASSERT_OK(built);
  EXPECT_EQ(*built, "built\n");
  // Written by the sandbox's root, stored as root: the upper is idmapped, so a layer captured from it has the
  // ownership the sandbox saw.
  struct stat owner_st {};
  ASSERT_EQ(lstat((upper.path() + "/upper/built.txt").c_str(), &owner_st), 0);
  EXPECT_EQ(owner_st.st_uid, 0u);
  EXPECT_EQ(owner_st.st_gid, 0u);
  struct stat st;
  ASSERT_EQ(lstat((upper.path() + "/upper/layer-file").c_str(), &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode)) << "whiteout expected";
}

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

TEST_F(ContainerTest, ConcurrentCreatesAndLatency) {
  // Sequential: create -> first exec, for information only.
  std::vector<double> create_ms, ready_ms;
  for (int i = 0; i < 30; ++i) {
    double t0 = monotonicSeconds();
    auto sb = backend_->create(makeSpec());
    ASSERT_OK(sb);
    double t1 = monotonicSeconds();
    backends::ExecRequest req;
    req.argv = {"true"};
    ASSERT_OK((*sb)->exec(req));
    double t2 = monotonicSeconds();
    ASSERT_OK((*sb)->destroy());
    create_ms.push_back((t1 - t0) * 1000);
    ready_ms.push_back((t2 - t0) * 1000);
  }
  printf("[ info ] sequential create p50 %.2f ms p99 %.2f ms; create+first exec p50 %.2f ms p99 %.2f ms\n",
         percentile(create_ms, 0.5), percentile(create_ms, 0.99), percentile(ready_ms, 0.5),
         percentile(ready_ms, 0.99));

  constexpr int kThreads = 8, kTotal = 50;
  std::atomic<int> next{0}, failures{0};
  std::vector<std::unique_ptr<backends::Sandbox>> made(kTotal);
  double t0 = monotonicSeconds();
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i; (i = next++) < kTotal;) {
        auto sb = backend_->create(makeSpec());
        if (!sb.ok()) {
          ++failures;
          ADD_FAILURE() << sb.error().toString();
          continue;
        }
        backends::ExecRequest req;
        req.argv = {"/bin/sh", "-c", "echo $(hostname)"};
        auto r = (*sb)->exec(req);
        if (!r.ok() || trim(r->stdout_data) != (*sb)->spec().id) ++failures;
        made[static_cast<size_t>(i)] = std::move(sb).value();
      }
    });
  }
  for (auto& th : threads) th.join();
  double took = monotonicSeconds() - t0;
  EXPECT_EQ(failures.load(), 0);
  printf("[ info ] %d creates+exec at concurrency %d: %.1f per second\n", kTotal, kThreads, kTotal / took);
  threads.clear();
  next = 0;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i; (i = next++) < kTotal;) {
        if (made[static_cast<size_t>(i)]) {
          std::string id = made[static_cast<size_t>(i)]->spec().id;
          EXPECT_OK(made[static_cast<size_t>(i)]->destroy());
          EXPECT_TRUE(cgroupDirsOf(id).empty());
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_FALSE(childrenLeftBehind());
}

}  // namespace
}  // namespace dsec::testing
