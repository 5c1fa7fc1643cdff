// Which accelerator runs guests: KVM where this host's KVM runs a stock guest kernel, else TCG (translation, slow
// but everywhere). A PVM host (kvm_pvm loaded) has a working /dev/kvm that only runs PVM-enabled guest kernels, so
// it counts as no KVM for dsec's kernel.
#include <fcntl.h>
#include <linux/kvm.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <map>
#include <mutex>
#include <utility>

#include "dsec/backends/vm/VmBackend.h"
#include "dsec/common/Fd.h"
#include "dsec/common/Process.h"
#include "dsec/common/Strings.h"

namespace dsec::backends::vm {
namespace {

// "" when KVM can run dsec's guest kernel, else why not.
std::string kvmProblem() {
  if (::access("/sys/module/kvm_pvm", F_OK) == 0) return "this host's KVM is PVM, which runs only PVM guest kernels";
  UniqueFd kvm(::open("/dev/kvm", O_RDWR | O_CLOEXEC));
  if (!kvm) return "open /dev/kvm: " + Error::sys(errno, "").message().substr(2);
  UniqueFd machine(::ioctl(kvm.get(), KVM_CREATE_VM, 0));
  if (!machine) return "KVM_CREATE_VM: " + Error::sys(errno, "").message().substr(2);
  return "";
}

}  // namespace

namespace {

Result<AccelChoice> probeAccel(const std::string& wanted, const std::string& qemu) {
  if (wanted != "auto" && wanted != "kvm" && wanted != "tcg") {
    return Error::invalid("accelerator \"" + wanted + "\": use auto, kvm or tcg");
  }
  auto listed = runCommand({qemu, "-accel", "help"});
  if (!listed.ok()) return listed.error().wrap("running " + qemu + " (install qemu-system-x86)");
  const std::string out = "\n" + listed->output;
  // Debian's QEMU lists TCG even when the module holding it is missing; the module dir says.
  constexpr const char* kModuleDir = "/usr/lib/x86_64-linux-gnu/qemu";
  bool tcg_module = ::access(kModuleDir, F_OK) != 0 ||
                    ::access((std::string(kModuleDir) + "/accel-tcg-x86_64.so").c_str(), F_OK) == 0;
  bool has_tcg = tcg_module && out.find("\ntcg\n") != std::string::npos,
       has_kvm = out.find("\nkvm\n") != std::string::npos;
  std::string kvm_problem = has_kvm ? kvmProblem() : "this QEMU has no KVM accelerator";
  if (wanted == "kvm") {
    if (!kvm_problem.empty()) return Error(ErrorCode::kUnsupported, "KVM asked for, but " + kvm_problem);
    return AccelChoice{"kvm", ""};
  }
  if (wanted == "auto" && kvm_problem.empty()) return AccelChoice{"kvm", ""};
  if (!has_tcg) {
    return Error(ErrorCode::kUnsupported, qemu +
                                              " has no TCG accelerator (Debian ships it in qemu-system-x86's "
                                              "modules: accel-tcg-x86_64.so)" +
                                              (kvm_problem.empty() ? "" : ", and " + kvm_problem));
  }
  if (wanted == "tcg") return AccelChoice{"tcg", "TCG (asked for): guests run translated, several times slower"};
  return AccelChoice{"tcg", "TCG, not KVM: " + kvm_problem + "; guests run translated, several times slower"};
}

}  // namespace

Result<AccelChoice> chooseAccel(const std::string& wanted, const std::string& qemu) {
  // Asked once per process and question: every node start asks for both machine backends and /v1/node.
  static std::mutex mu;
  static std::map<std::pair<std::string, std::string>, Result<AccelChoice>> answers;
  std::lock_guard lock(mu);
  auto key = std::make_pair(wanted, qemu);
  auto it = answers.find(key);
  if (it == answers.end()) it = answers.emplace(key, probeAccel(wanted, qemu)).first;
  return it->second;
}

}  // namespace dsec::backends::vm
