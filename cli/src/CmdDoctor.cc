// dsec doctor: what this host supports for dsec (namespaces, cgroups, overlay/EROFS, KVM, BPF LSM...), whether
// the sandbox init helper and the layer store are usable. Exits 0 when container sandboxes can run here.
#include <sys/stat.h>
#include <unistd.h>

#include <iostream>

#include "Commands.h"
#include "SharedStoreCommands.h"
#include "dsec/backends/container/ContainerBackend.h"
#include "dsec/backends/vm/Initramfs.h"
#include "dsec/backends/vm/VmBackend.h"
#include "dsec/common/Cgroup.h"
#include "dsec/common/HostFeatures.h"
#include "dsec/common/Process.h"
#include "dsec/common/Strings.h"
#include "dsec/fs3/ChunkStore.h"
#include "dsec/fs3/LayerStore.h"
#include "dsec/fs3/SharedStore.h"
#include "dsec/launcher/api/HttpStore.h"

namespace dsec::cli {

namespace {

void line(const std::string& what, bool ok, const std::string& detail) {
  std::cout << "  " << (ok ? "[ok]   " : "[MISS] ") << what << (detail.empty() ? "" : ": " + detail) << "\n";
}

}  // namespace

int cmdDoctor(const Invocation& inv) {
  CommonOptions common;
  po::options_description desc("options");
  addCommonOptions(desc, &common, false);
  po::variables_map vm;
  if (!parseCommandLine(inv, inv.args, desc, {}, "", &vm, &common)) return kExitOk;

  bool container_ok = true;
  HostFeatures host = probeHostFeatures();
  std::cout << "host:\n" << formatHostFeatures(host) << "\n";
  container_ok = host.missingRequired().empty();

  std::cout << "cgroups:\n";
  auto driver = detectCgroupDriver("dsec");
  line("cgroup driver", driver.ok(), driver.ok() ? (*driver)->describe() : driver.error().message());
  container_ok = container_ok && driver.ok();

  std::cout << "container backend:\n";
  auto backend = backends::makeContainerBackend({});
  if (!backend.ok()) {
    line("container backend", false, backend.error().message());
    container_ok = false;
  } else {
    std::string init_problem;
    std::string spawner_problem;
    std::string userns_problem;
    std::string other;
    for (const auto& m : (*backend)->missingFeatures()) {
      if (startsWith(m, "dsec-sandbox-init")) {
        init_problem = m;
      } else if (startsWith(m, "dsec-sandbox-spawner")) {
        spawner_problem = m;
      } else if (startsWith(m, "user namespaces") || startsWith(m, "idmapped mounts")) {
        userns_problem = m;
      } else {
        other += (other.empty() ? "missing " : ", ") + m;
      }
    }
    line("dsec-sandbox-init", init_problem.empty(), init_problem.empty() ? "found" : init_problem);
    line("dsec-sandbox-spawner", spawner_problem.empty(), spawner_problem.empty() ? "found" : spawner_problem);
    line("sandbox root", userns_problem.empty(),
         userns_problem.empty() ? "a user namespace and host id range of its own (user namespaces, idmapped mounts)"
                                : "missing " + userns_problem);
    line("container backend", other.empty(), other.empty() ? "usable" : other);
    const std::string egress = backends::egressSupportProblem();
    line("network egress", egress.empty(),
         egress.empty() ? "nftables and IPv4 forwarding: sandboxes may get a route out (never to the node)"
                        : "missing " + egress + " (network \"egress\" sandboxes and layer builds fail)");
    const std::string filewatch = backends::fileWatchSupportProblem();
    line("protected-path record", filewatch.empty(),
         filewatch.empty() ? "refused writes to protected paths are recorded as violations (syscall tracepoints)"
                           : filewatch + " (paths stay protected; refusals are not recorded)");
    container_ok =
        container_ok && init_problem.empty() && spawner_problem.empty() && userns_problem.empty() && other.empty();
  }

  std::cout << "microvm and vm backends:\n";
  {
    bool qemu = !findProgram("qemu-system-x86_64").empty();
    line("QEMU", qemu,
         qemu ? "qemu-system-x86_64 found" : "qemu-system-x86_64 missing (apt-get install qemu-system-x86)");
    auto accel = backends::vm::chooseAccel("auto", "qemu-system-x86_64");
    line("accelerator", accel.ok(),
         accel.ok() ? accel->accel + (accel->note.empty() ? "" : " (" + accel->note + ")") : accel.error().message());
    auto kernel = backends::vm::findGuestKernelDir();
    line("guest kernel", kernel.ok(), kernel.ok() ? *kernel : kernel.error().message());
    auto agent = backends::vm::findGuestAgent();
    line("dsec-guest-agent", agent.ok(), agent.ok() ? *agent : agent.error().message());
    std::cout << (qemu && accel.ok() && kernel.ok() && agent.ok() ? "  microvm/vm sandboxes can run here\n"
                                                                  : "  microvm/vm sandboxes cannot run here\n");
  }

  std::cout << "layer store (" << common.root << "):\n";
  if (access(common.root.c_str(), F_OK) != 0) {
    line("root", true, "does not exist yet (created on first use)");
  } else {
    bool writable = access(common.root.c_str(), W_OK) == 0;
    line("root", writable, writable ? "writable" : "not writable");
    fs3::LayerStore store(common.root);
    auto layers = store.list();
    line("layers", layers.ok(), layers.ok() ? std::to_string(layers->size()) + " layer(s)" : layers.error().message());
  }
  std::cout << "shared layer store (on-demand layers, docs/layer-store.md):\n";
  {
    bool fuse = access("/dev/fuse", R_OK | W_OK) == 0;
    line("FUSE", fuse,
         fuse ? "/dev/fuse" : "/dev/fuse missing: nodes started with --store cannot mount layers on demand");
    const std::string store = defaultStore();
    if (store.empty()) {
      line("store", true, "none given (--store or DSEC_STORE): layers come from the node's own store only");
    } else if (fs3::isHttpStore(store)) {
      // No listing over HTTP: a layer no store has tells a server that answers (404) from one that does not.
      auto http = launcher::openSharedStore(store, 1);
      auto probe = http.ok() ? (*http)->manifest(fs3::LayerRef{"dsec-doctor-probe", "0"}) : http.error();
      const bool answers = !probe.ok() && probe.error().code() == ErrorCode::kNotFound;
      line("store " + store, answers, answers ? "a chunk server answers" : probe.error().message());
    } else {
      fs3::ChunkStore shared(store);
      struct stat st {};
      if (::stat(shared.dir().c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
        line("store " + shared.dir(), false, "not a directory this host can read");
      } else {
        auto stats = shared.stats();
        line("store " + shared.dir(), stats.ok(),
             stats.ok() ? std::to_string(stats->layers) + " layer(s) in " + std::to_string(stats->chunks) + " chunks"
                        : stats.error().message());
      }
    }
  }
  std::cout << (container_ok ? "container sandboxes can run on this host\n"
                             : "container sandboxes cannot run on this host (see [MISS] above)\n");
  return container_ok ? kExitOk : kExitFailure;
}

}  // namespace dsec::cli
