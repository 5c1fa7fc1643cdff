// A machine snapshot of a running (or paused) VM: the guest stops, QEMU writes its device and CPU state to a file
// (migration to an fd; guest RAM is skipped when it is the shared RAM file, x-ignore-shared), the RAM file's data
// extents are copied, and the guest goes on where it was. A restore (VmBackend.cc) maps that RAM copy-on-write.
#include <fcntl.h>
#include <unistd.h>

#include "VmSandbox.h"
#include "VmSnapshotFiles.h"
#include "dsec/common/Logging.h"
#include "dsec/common/Strings.h"

namespace dsec::backends::vm {
namespace {

constexpr double kMigrationTimeout = 300;
constexpr double kMonitorTimeout = 30;

}  // namespace

Result<SnapshotKind> VmSandbox::snapshot(const std::string& dir) {
  DSEC_TRY(waitWrites());
  std::lock_guard lock(qmp_mu_);
  if (state_.load() == SandboxState::kStopped) return stopped().error();
  const bool was_running = state_.load() == SandboxState::kRunning;
  const double start = monotonicSeconds();
  if (was_running) DSEC_TRY(qmp_->execute("stop", nullptr, kMonitorTimeout));
  // Whatever happens below, a sandbox that ran runs on.
  struct Resume {
    QmpClient* qmp;
    bool armed;
    ~Resume() {
      if (armed) {
        if (auto st = qmp->execute("cont", nullptr, kMonitorTimeout); !st.ok()) {
          DSEC_LOG(kWarn, "vm") << "resume after a snapshot: " << st.error().toString();
        }
      }
    }
  } resume{&*qmp_, was_running};

  const std::string state_path = dir + "/" + kSnapshotStateFile;
  UniqueFd state(::open(state_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!state) return Error::sys(errno, "create " + state_path);
  DSEC_TRY(qmp_->execute("migrate-set-capabilities",
                         {{"capabilities", {{{"capability", "x-ignore-shared"}, {"state", true}}}}}, kMonitorTimeout));
  DSEC_TRY(qmp_->sendFd("snapshot", state.get(), kMonitorTimeout));
  DSEC_TRY(qmp_->execute("migrate", {{"uri", "fd:snapshot"}}, kMonitorTimeout));
  DSEC_TRY(qmp_->waitMigration(kMigrationTimeout));
  if (::fsync(state.get()) != 0) return Error::sys(errno, "fsync " + state_path);
  state.reset();

  VmSnapshotInfo info;
  info.kind = backendName();
  info.memory_bytes = machine_.memory_bytes;
  info.cpus = machine_.cpus;
  info.layers = static_cast<int>(spec_.lower_files.size());
  info.kernel_release = machine_.kernel_release;
  info.ram_file = machine_.ram_shared;
  int64_t ram_bytes = 0;
  if (machine_.ram_shared) {
    // The guest is stopped: the RAM file holds exactly what the state refers to.
    DSEC_ASSIGN_OR_RETURN(ram_bytes, copySparse(machine_.run_dir + "/ram", dir + "/" + kSnapshotRamFile));
  }
  DSEC_TRY(writeSnapshotInfo(dir, info));
  DSEC_LOG(kDebug, "vm") << spec_.id << ": snapshot in " << (monotonicSeconds() - start) * 1000 << " ms, "
                         << (ram_bytes >> 20) << " MiB of RAM";
  return SnapshotKind::kMachine;
}

}  // namespace dsec::backends::vm
