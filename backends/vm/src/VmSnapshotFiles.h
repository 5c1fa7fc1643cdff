// A machine snapshot's files: snapshot.json's neighbour vm.json (what machine it was), "state" (QEMU's device
// and CPU state, the migration stream) and "ram" (guest RAM; absent when the stream carries it: a snapshot of a
// sandbox that was itself restored).
#pragma once

#include <cstdint>
#include <string>

#include "Qmp.h"
#include "dsec/common/Result.h"

namespace dsec::backends::vm {

inline constexpr const char* kSnapshotRamFile = "ram";
inline constexpr const char* kSnapshotStateFile = "state";
inline constexpr const char* kSnapshotInfoFile = "vm.json";

struct VmSnapshotInfo {
  std::string kind;  // "microvm" | "vm"
  int64_t memory_bytes = 0;
  int cpus = 1;
  int layers = 0;
  bool ram_file = false;
  std::string kernel_release;  // the image's own kernel the machine booted; "" : dsec's guest kernel
};

Result<VmSnapshotInfo> readSnapshotInfo(const std::string& dir);
Status writeSnapshotInfo(const std::string& dir, const VmSnapshotInfo& info);

// Copies the extents of src that hold data (SEEK_DATA/SEEK_HOLE) into a new file dst of the same size: a guest
// that touched 100 MiB of its 512 costs 100 MiB. Returns the bytes copied.
Result<int64_t> copySparse(const std::string& src, const std::string& dst);

// A restore: feeds the snapshot's state to a QEMU started with -incoming defer, and waits until it has loaded
// and runs.
Status loadState(QmpClient& qmp, const std::string& dir);

}  // namespace dsec::backends::vm
