// Snapshots, restores and forks of microVMs: memory and processes are carried, the copies diverge, and a snapshot
// that cannot be restored is refused clearly.
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <set>
#include <thread>

#include "VmTestSupport.h"
#include "dsec/common/Strings.h"

namespace dsec::testing {
namespace {

class VmSnapshotTest : public VmTest {};

// A process's resident memory (VmRSS), or -1.
int64_t residentBytes(pid_t pid) {
  auto status = readFile("/proc/" + std::to_string(pid) + "/status");
  if (!status.ok()) return -1;
  size_t at = status->find("VmRSS:");
  return at == std::string::npos ? -1 : std::strtoll(status->c_str() + at + 6, nullptr, 10) * 1024;
}

TEST_F(VmSnapshotTest, ForksCarryFilesAndRunningProcessesAndThenDiverge) {
  auto parent_spec = makeSpec();
  parent_spec.disk_bytes = 96ll << 20;
  auto& parent = create(parent_spec);
  sh(parent, "echo 'set up before the snapshot' > /work/state");
  // 48 MiB of random bytes in the upper (guest RAM): pages a copy will free later.
  sh(parent, "dd if=/dev/urandom of=/work/payload bs=1M count=48 2>/dev/null");
  const std::string payload_sum = sh(parent, "md5sum < /work/payload").stdout_data;
  ASSERT_EQ(payload_sum.size(), 36u) << payload_sum;
  // A process with a counter in memory: it keeps counting in every copy.
  sh(parent,
     "setsid sh -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/counter; sleep 0.1; done' "
     "</dev/null >/dev/null 2>&1 &");
  shUntilChanged(parent, "cat /tmp/counter 2>/dev/null", "");
  int before = std::atoi(trim(sh(parent, "cat /tmp/counter").stdout_data).c_str());
  ASSERT_GT(before, 0);

  TempDir snap;
  auto kind = parent.snapshot(snap.path());
  ASSERT_OK(kind);
  EXPECT_EQ(*kind, backends::SnapshotKind::kMachine);
  EXPECT_EQ(parent.state(), backends::SandboxState::kRunning);
  EXPECT_EQ(sh(parent, "echo still running").stdout_data, "still running\n");

  std::vector<backends::Sandbox*> forks;
  for (int i = 0; i < 2; ++i) {
    auto spec = makeSpec();
    auto copy = backend_->restore(spec, snap.path());
    ASSERT_OK(copy);
    forks.push_back(&adopt(std::move(copy).value()));
  }
  std::set<std::string> randoms;
  for (size_t i = 0; i < forks.size(); ++i) {
    auto& f = *forks[i];
    EXPECT_EQ(sh(f, "cat /work/state").stdout_data, "set up before the snapshot\n");
    EXPECT_EQ(sh(f, "hostname").stdout_data, f.spec().id + "\n");
    int c1 = std::atoi(trim(sh(f, "cat /tmp/counter").stdout_data).c_str());
    EXPECT_GE(c1, before);
    int c2 = std::atoi(trim(shUntilChanged(f, "cat /tmp/counter", std::to_string(c1) + "\n")).c_str());
    EXPECT_GT(c2, c1) << "the counter process did not survive the restore";
    sh(f, "echo mine > /work/fork-" + std::to_string(i));
    randoms.insert(sh(f, "head -c 16 /dev/urandom | md5sum").stdout_data);
  }
  EXPECT_EQ(randoms.size(), forks.size()) << "forks share their random state";
  // Divergence: no copy sees another's writes, and the parent sees none.
  EXPECT_EQ(sh(*forks[0], "ls /work").stdout_data, "fork-0\npayload\nstate\n");
  EXPECT_EQ(sh(*forks[1], "ls /work").stdout_data, "fork-1\npayload\nstate\n");
  EXPECT_EQ(sh(parent, "ls /work").stdout_data, "payload\nstate\n");

  // Memory a copy frees goes back to the host without touching the snapshot: a copy drops the pages of a file the
  // parent wrote before the snapshot, free page reporting hands them back, and a new restore still reads them.
  // The copy reads the payload first, so its QEMU maps those pages of the snapshot's RAM file; once the guest has
  // freed them and free page reporting has handed them back, QEMU has dropped them (its RSS falls): only then has
  // the snapshot been at risk.
  EXPECT_EQ(sh(*forks[0], "md5sum < /work/payload").stdout_data, payload_sum);
  const auto qemu = forks[0]->persistentState()["pid"].get<pid_t>();
  const int64_t mapped = residentBytes(qemu);
  ASSERT_GT(mapped, 48ll << 20);
  sh(*forks[0], "rm /work/payload; sync; echo 3 > /proc/sys/vm/drop_caches");
  ASSERT_OK(forks[0]->reclaimMemory());
  int64_t now = mapped;
  for (const double deadline = monotonicSeconds() + 60; monotonicSeconds() < deadline;) {
    now = residentBytes(qemu);
    if (now >= 0 && now <= mapped - (24ll << 20)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  ASSERT_LE(now, mapped - (24ll << 20)) << "the copy's freed pages never went back to the host (RSS "
                                        << formatBytes(mapped) << " -> " << formatBytes(now) << ")";
  auto late = backend_->restore(makeSpec(), snap.path());
  ASSERT_OK(late);
  auto& third = adopt(std::move(late).value());
  EXPECT_EQ(sh(third, "md5sum < /work/payload").stdout_data, payload_sum);

  // A copy can itself be snapshotted and restored (its RAM then travels in the state stream).
  TempDir second;
  ASSERT_OK(forks[0]->snapshot(second.path()));
  auto grandchild = backend_->restore(makeSpec(), second.path());
  ASSERT_OK(grandchild);
  auto& g = adopt(std::move(grandchild).value());
  EXPECT_EQ(sh(g, "ls /work").stdout_data, "fork-0\nstate\n");

  // Destroying the copies leaves the snapshot usable and nothing of theirs behind.
  std::string id = forks[1]->spec().id;
  ASSERT_OK(forks[1]->destroy());
  EXPECT_TRUE(leftoversOf(id).empty());
}

TEST_F(VmSnapshotTest, BadSnapshotsAreRefusedClearly) {
  TempDir empty;
  auto none = backend_->restore(makeSpec(), empty.path());
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.error().message().find("vm.json"), std::string::npos) << none.error().toString();

  TempDir corrupt;
  ASSERT_OK(writeFile(corrupt.path() + "/vm.json", "{\"kind\": \"microvm\", \"memory_bytes\": -5}"));
  EXPECT_FALSE(backend_->restore(makeSpec(), corrupt.path()).ok());

  TempDir other;
  ASSERT_OK(writeFile(other.path() + "/vm.json",
                      R"({"kind": "vm", "memory_bytes": 268435456, "cpus": 1, "layers": 1, "ram_file": true})"));
  auto wrong_kind = backend_->restore(makeSpec(), other.path());
  ASSERT_FALSE(wrong_kind.ok());
  EXPECT_NE(wrong_kind.error().message().find("restored as microvm"), std::string::npos);

  TempDir layers;
  ASSERT_OK(writeFile(layers.path() + "/vm.json",
                      R"({"kind": "microvm", "memory_bytes": 268435456, "cpus": 1, "layers": 3, "ram_file": true})"));
  EXPECT_FALSE(backend_->restore(makeSpec(), layers.path()).ok());

  // A state file that is garbage fails the restore and leaves nothing.
  TempDir garbage;
  ASSERT_OK(writeFile(garbage.path() + "/vm.json",
                      R"({"kind": "microvm", "memory_bytes": 268435456, "cpus": 1, "layers": 1, "ram_file": false})"));
  ASSERT_OK(writeFile(garbage.path() + "/state", std::string(4096, 'x')));
  auto spec = makeSpec();
  auto bad = backend_->restore(spec, garbage.path());
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(leftoversOf(spec.id).empty());
}

}  // namespace
}  // namespace dsec::testing
