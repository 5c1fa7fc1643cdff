// A minimal QEMU launcher for the guest agent's tests (the product's launcher is backends/vm's own): boots the
// guest kernel with the agent's initramfs and a busybox EROFS layer under TCG, its ports as unix sockets.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "dsec/backends/vm/AgentChannel.h"
#include "dsec/common/Fd.h"
#include "dsec/common/Result.h"

namespace dsec::testing {

struct TestVmOptions {
  bool q35 = false;  // else microvm (virtio-mmio)
  int ports = 4;
  int memory_mb = 512;
};

// Why the VM tests cannot run here (no QEMU, no TCG module, no guest kernel, no busybox or mkfs.erofs); empty if
// they can.
std::string vmTestSkipReason();

class TestVm {
 public:
  static Result<std::unique_ptr<TestVm>> start(const TestVmOptions& options);
  ~TestVm();
  TestVm(const TestVm&) = delete;
  TestVm& operator=(const TestVm&) = delete;

  // New connections to every port's socket (QEMU takes one client per port at a time).
  Result<std::vector<UniqueFd>> connectPorts(double timeout_seconds);
  Result<std::unique_ptr<backends::vm::AgentChannel>> connectChannel(double timeout_seconds);
  // SIGKILL to QEMU (the guest vanishes mid-whatever).
  void kill();
  // QEMU's serial console: the guest kernel's and agent's messages.
  std::string consoleLog() const;

 private:
  TestVm() = default;
  std::string run_dir_;
  int ports_ = 0;
  pid_t qemu_ = -1;
};

}  // namespace dsec::testing
