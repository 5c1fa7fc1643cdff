// The container acceptance scenarios against a microvm (real QEMU under TCG here): exec, files, limits,
// isolation, pause/resume, re-adoption by a new backend, and nothing left behind.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "VmTestSupport.h"
#include "dsec/common/Process.h"
#include "dsec/common/Strings.h"

namespace dsec::testing {
namespace {

using backends::ExecRequest;
using backends::SandboxState;

std::string readAll(int fd) {
  std::string out;
  char buf[65536];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  return out;
}

std::string procStatusField(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return trim(line.substr(field.size() + 1));
  }
  return "";
}

class MicrovmTest : public VmTest {};

TEST_F(MicrovmTest, ExecAndFilesWorkLikeAContainer) {
  auto& sb = create();
  EXPECT_EQ(sb.state(), SandboxState::kRunning);
  EXPECT_EQ(sb.backendName(), "microvm");

  auto r = sh(sb, "echo out; echo err >&2; exit 3");
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_EQ(r.stdout_data, "out\n");
  EXPECT_EQ(r.stderr_data, "err\n");
  EXPECT_EQ(sh(sb, "hostname").stdout_data, sb.spec().id + "\n");
  EXPECT_EQ(sh(sb, "cat /layer-file").stdout_data, "from the layer\n");

  ExecRequest in;
  in.argv = {"wc", "-c"};
  in.stdin_data = std::string(100000, 'x');
  auto counted = sb.exec(in);
  ASSERT_OK(counted);
  EXPECT_EQ(trim(counted->stdout_data), "100000");

  // Files: write (parents made), read, stat, list, remove.
  {
    auto w = sb.openForWrite("/work/deep/a.txt", 0640);
    ASSERT_OK(w);
    std::string data = "hello from the host\n";
    ASSERT_EQ(::write(w->get(), data.data(), data.size()), static_cast<ssize_t>(data.size()));
  }
  EXPECT_EQ(sh(sb, "cat /work/deep/a.txt").stdout_data, "hello from the host\n");
  auto st = sb.stat("/work/deep/a.txt");
  ASSERT_OK(st);
  EXPECT_EQ(st->size, 20);
  EXPECT_EQ(st->type, "file");
  EXPECT_EQ(st->mode & 0777, 0640u);
  sh(sb, "printf 'written inside' > /work/deep/b.txt");
  auto rd = sb.openForRead("/work/deep/b.txt");
  ASSERT_OK(rd);
  EXPECT_EQ(readAll(rd->get()), "written inside");
  auto listed = sb.listDir("/work/deep");
  ASSERT_OK(listed);
  EXPECT_EQ(listed->size(), 2u);
  EXPECT_OK(sb.remove("/work/deep", true));
  EXPECT_EQ(sh(sb, "test -e /work/deep && echo there || echo gone").stdout_data, "gone\n");
  EXPECT_FALSE(sb.stat("/work/nope").ok());
}

TEST_F(MicrovmTest, LimitsHold) {
  auto spec = makeSpec();
  spec.pids = 32;
  spec.disk_bytes = 16ll << 20;
  auto& sb = create(spec);

  // Output cap.
  ExecRequest big;
  big.argv = {"/bin/sh", "-c", "head -c 3000000 /dev/zero"};
  big.output_cap = 1000;
  auto capped = sb.exec(big);
  ASSERT_OK(capped);
  EXPECT_TRUE(capped->truncated);
  EXPECT_EQ(capped->stdout_data.size(), 1000u);

  // Timeout kills the command.
  ExecRequest slow;
  slow.argv = {"sleep", "30"};
  slow.timeout_seconds = 1;
  double t0 = monotonicSeconds();
  auto timed = sb.exec(slow);
  ASSERT_OK(timed);
  EXPECT_TRUE(timed->timed_out);
  EXPECT_LT(monotonicSeconds() - t0, 15);

  // Disk: the upper is 16 MiB.
  auto disk = sh(sb, "dd if=/dev/zero of=/work/fill bs=1M count=64 2>&1; echo rc=$?");
  EXPECT_NE(disk.stdout_data.find("No space left"), std::string::npos) << disk.stdout_data;
  sh(sb, "rm -f /work/fill");

  // Pids: 32 in all. busybox sh exits at the first fork refused, so the count comes from a command of its own
  // (one process: the slot the shell left).
  sh(sb, "for i in $(seq 1 60); do sleep 20 & done", 60);
  ExecRequest count;
  count.argv = {"pidof", "sleep"};
  count.timeout_seconds = 60;
  auto pids = sb.exec(count);
  ASSERT_OK(pids);
  std::istringstream words(pids->stdout_data);
  ExecRequest stop;
  stop.argv = {"kill"};
  stop.timeout_seconds = 60;
  int running = 0;
  for (std::string w; words >> w; ++running) stop.argv.push_back(w);
  EXPECT_GT(running, 5) << pids->stdout_data << pids->stderr_data;
  EXPECT_LT(running, 32) << pids->stdout_data;
  if (running > 0) EXPECT_OK(sb.exec(stop));

  // Memory: the guest's RAM is the limit; a hog is killed inside, the sandbox survives.
  // (dd's buffer is one block: 600 MiB in a 256 MiB guest.)
  auto hog = sh(sb, "dd if=/dev/zero of=/dev/null bs=600M count=1 2>/dev/null; echo rc=$?", 120);
  EXPECT_NE(hog.stdout_data, "rc=0\n");
  EXPECT_EQ(sh(sb, "echo alive").stdout_data, "alive\n");
}

TEST_F(MicrovmTest, IsolatedFromTheHostAndQemuIsConfined) {
  auto& sb = create();
  // The sandbox sees the layer's files, not the host's.
  EXPECT_EQ(sh(sb, "cat /etc/shadow").stdout_data, "root:SANDBOX-SHADOW:19000:0:99999:7:::\n");
  auto host_kernel = runCommandChecked({"uname", "-v"});
  ASSERT_OK(host_kernel);
  EXPECT_NE(sh(sb, "uname -v").stdout_data, *host_kernel);
  // No network: only loopback.
  auto links = sh(sb, "ls /sys/class/net");
  EXPECT_EQ(trim(links.stdout_data), "lo") << links.stdout_data;

  // QEMU runs as an unprivileged uid of its own, with no_new_privs and a seccomp filter.
  auto state = sb.persistentState();
  pid_t pid = state.at("pid").get<pid_t>();
  std::string uids = procStatusField(pid, "Uid");
  EXPECT_EQ(uids.substr(0, uids.find_first_of(" \t")), std::to_string(state.at("host_base").get<uint32_t>()));
  EXPECT_NE(uids.rfind("0", 0), 0u) << uids;
  EXPECT_EQ(procStatusField(pid, "NoNewPrivs"), "1");
  EXPECT_EQ(procStatusField(pid, "Seccomp"), "2");
}

TEST_F(MicrovmTest, PauseResumeAndDestroyLeaveNothing) {
  auto& sb = create();
  std::string id = sb.spec().id;
  pid_t pid = sb.persistentState().at("pid").get<pid_t>();
  ASSERT_OK(sb.pause());
  EXPECT_EQ(sb.state(), SandboxState::kPaused);
  ASSERT_OK(sb.resume());
  EXPECT_EQ(sh(sb, "echo back").stdout_data, "back\n");
  auto u = sb.usage();
  ASSERT_OK(u);
  EXPECT_GT(u->memory_bytes, 0);
  EXPECT_OK(sb.reclaimMemory());
  EXPECT_FALSE(leftoversOf(id).empty());
  ASSERT_OK(sb.destroy());
  EXPECT_OK(sb.destroy());  // idempotent
  EXPECT_EQ(sb.state(), SandboxState::kStopped);
  EXPECT_NE(::kill(pid, 0), 0);
  EXPECT_TRUE(leftoversOf(id).empty());
  ExecRequest after;
  after.argv = {"true"};
  EXPECT_FALSE(sb.exec(after).ok());
  // The backend's own files (the initramfs, its run root) go with it when no sandbox is left in them.
  sandboxes_.clear();
  backend_.reset();
  const std::string run_root = std::string("/dev/shm/dsec-vm/") + kVmTestCgroupParent + "/microvm";
  EXPECT_NE(::access(run_root.c_str(), F_OK), 0) << run_root << " is left";
}

TEST_F(MicrovmTest, ReclaimHandsFreedGuestMemoryBackToTheHost) {
  auto spec = makeSpec();
  spec.disk_bytes = 160ll << 20;
  auto& sb = create(spec);
  // 128 MiB written into the upper (guest RAM, backed by the host's RAM file) and deleted again.
  sh(sb, "dd if=/dev/urandom of=/work/big bs=1M count=128 2>/dev/null; sync");
  auto full = sb.usage();
  ASSERT_OK(full);
  sh(sb, "rm /work/big");
  ASSERT_OK(sb.reclaimMemory());
  // Free page reporting runs on the guest's own schedule (about every 2 s): poll.
  int64_t now = full->memory_bytes;
  for (int i = 0; i < 60 && full->memory_bytes - now < (64ll << 20); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    auto u = sb.usage();
    ASSERT_OK(u);
    now = u->memory_bytes;
  }
  EXPECT_GE(full->memory_bytes - now, 64ll << 20)
      << "the host still holds " << (now >> 20) << " MiB of the guest's " << (full->memory_bytes >> 20) << " MiB";
}

TEST_F(MicrovmTest, AFailedCreateLeavesNothing) {
  auto spec = makeSpec();
  spec.lower_files = {"/nonexistent/layer.erofs"};
  auto made = backend_->create(spec);
  ASSERT_FALSE(made.ok());
  EXPECT_NE(made.error().message().find("QEMU"), std::string::npos) << made.error().toString();
  EXPECT_TRUE(leftoversOf(spec.id).empty());

  auto networked = makeSpec();
  networked.network = backends::NetworkMode::kEgress;
  auto refused = backend_->create(networked);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message().find("network"), std::string::npos);
  auto tiny = makeSpec();
  tiny.memory_bytes = 16 << 20;
  EXPECT_FALSE(backend_->create(tiny).ok());
}

TEST_F(MicrovmTest, ANewBackendReadoptsRunningAndPausedSandboxes) {
  auto& sb = create();
  sh(sb, "setsid sh -c 'while true; do date +%s > /tmp/beat; sleep 0.2; done' </dev/null >/dev/null 2>&1 &");
  sh(sb, "echo kept > /work/kept");
  auto& paused = create();
  ASSERT_OK(paused.pause());
  auto state = sb.persistentState();
  auto paused_state = paused.persistentState();
  // The agent goes away without destroying them: handles and backend dropped, QEMUs run on.
  for (auto& s : sandboxes_) s.reset();
  sandboxes_.clear();
  backend_.reset();

  backend_ = newBackend();
  ASSERT_TRUE(backend_);
  auto leftovers = backend_->listLeftovers();
  ASSERT_OK(leftovers);
  EXPECT_NE(std::find(leftovers->begin(), leftovers->end(), state.at("id").get<std::string>()), leftovers->end());
  auto again = backend_->adopt(state);
  ASSERT_OK(again);
  auto& back = adopt(std::move(again).value());
  EXPECT_EQ(back.state(), SandboxState::kRunning);
  EXPECT_EQ(sh(back, "cat /work/kept").stdout_data, "kept\n");
  auto b1 = sh(back, "cat /tmp/beat").stdout_data;
  EXPECT_NE(shUntilChanged(back, "cat /tmp/beat", b1), b1) << "the background loop stopped";

  auto paused_again = backend_->adopt(paused_state);
  ASSERT_OK(paused_again);
  auto& p = adopt(std::move(paused_again).value());
  EXPECT_EQ(p.state(), SandboxState::kPaused);
  ASSERT_OK(p.resume());
  EXPECT_EQ(sh(p, "echo up").stdout_data, "up\n");

  // A state naming a QEMU that is gone is not adopted; reap removes what is left.
  auto gone = state;
  gone["start_time"] = 1;
  EXPECT_FALSE(backend_->adopt(gone).ok());
}

class FullVmTest : public VmTest {
 protected:
  backends::BackendKind kind() const override { return backends::BackendKind::kVm; }
};

TEST_F(FullVmTest, Q35BootsTheSameAgent) {
  auto& sb = create();
  EXPECT_EQ(sb.backendName(), "vm");
  auto r = sh(sb, "cat /layer-file; hostname");
  EXPECT_EQ(r.stdout_data, "from the layer\n" + sb.spec().id + "\n");
  std::string id = sb.spec().id;
  ASSERT_OK(sb.destroy());
  EXPECT_TRUE(leftoversOf(id).empty());
}

}  // namespace
}  // namespace dsec::testing
