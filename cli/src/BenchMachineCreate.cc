// dsec bench create --backend microvm|vm: three ways to a first command in a machine of this shape, measured in
// one run beside each other:
//   cold    create (boot) -> first exec `true`;
//   restore one sandbox created and snapshotted, then creates from that snapshot -> first exec `true`;
//   peer    a plain QEMU (same binary, machine, accelerator and guest kernel) booting a busybox initramfs to a
//           marker on its console (PeerBoot.h): what any boot of this shape costs here.
// One sample at a time, each sandbox destroyed after its sample: under TCG guests share the host's two cores, so
// a VM left running (its timers, its idle loop) would slow the next sample.
#include "BenchMachineCreate.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <iostream>

#include "BenchMachine.h"
#include "PeerBoot.h"
#include "Progress.h"
#include "dsec/backends/vm/Initramfs.h"
#include "dsec/backends/vm/VmBackend.h"
#include "dsec/common/Strings.h"

namespace dsec::cli {
namespace {

// The target for a restore to its first command, under TCG.
constexpr double kRestoreTargetMs = 80;

struct Samples {
  std::vector<double> ms;
  std::vector<double> create_ms;  // the create request alone (cold, restore)
  int failures = 0;
  std::string first_error;

  void fail(const std::string& error) {
    ++failures;
    if (first_error.empty()) first_error = error;
  }
  double p50() const { return percentile(ms, 50); }
  double p99() const { return percentile(ms, 99); }
};

// count times: create_body, then `true`, timed together; the sandbox is destroyed afterwards (not timed).
Samples createExecDestroy(ApiClient& client, const nlohmann::json& create_body, int count, Progress& progress) {
  Samples samples;
  std::mutex mu;
  nlohmann::json exec_body{{"cmd", nlohmann::json::array({"true"})}, {"timeout", 600}};
  for (int i = 0; i < count; ++i) {
    std::vector<std::string> ids;
    double t0 = monotonicSeconds();
    double created = t0;
    std::string error = createAndExec(client, create_body, exec_body, &mu, &ids, &created);
    double t1 = monotonicSeconds();
    if (error.empty()) {
      samples.ms.push_back((t1 - t0) * 1000.0);
      samples.create_ms.push_back((created - t0) * 1000.0);
    } else {
      samples.fail(error);
    }
    for (const auto& id : ids) (void)client.call(HttpMethod::kDelete, "/v1/sandboxes/" + percentEncode(id));
    progress.advance();
  }
  return samples;
}

// The source of the restores: created, its first command run, snapshotted. Returns the snapshot's name and puts
// the source's id into *source_id (destroyed by the caller) and its guest RAM into *memory_bytes.
Result<std::string> snapshotSource(ApiClient& client, const nlohmann::json& create_body, std::string* source_id,
                                   int64_t* memory_bytes) {
  DSEC_ASSIGN_OR_RETURN(auto info, client.call(HttpMethod::kPost, "/v1/sandboxes", create_body));
  *source_id = info.value("id", "");
  *memory_bytes = info.value("memory", *memory_bytes);
  DSEC_TRY(execOk(client, *source_id, {"true"}));
  std::string name = "bench-restore-" + randomHex(8);
  DSEC_ASSIGN_OR_RETURN(
      auto snapshot,
      client.call(HttpMethod::kPost, "/v1/sandboxes/" + percentEncode(*source_id) + "/snapshot", {{"name", name}}));
  return snapshot.value("name", name);
}

Samples bootPeers(const PeerBootConfig& config, int count, Progress& progress) {
  Samples samples;
  for (int i = 0; i < count; ++i) {
    auto seconds = bootPeerOnce(config);
    if (seconds.ok()) {
      samples.ms.push_back(*seconds * 1000.0);
    } else {
      samples.fail(seconds.error().message());
    }
    progress.advance();
  }
  return samples;
}

// The peer's QEMU configuration, its initramfs written into dir.
Result<PeerBootConfig> peerConfig(backends::BackendKind kind, int64_t memory_bytes, const std::string& dir) {
  PeerBootConfig config;
  config.kind = kind;
  config.memory_bytes = memory_bytes;
  DSEC_ASSIGN_OR_RETURN(auto accel, backends::vm::chooseAccel("auto", config.qemu));
  config.accel = accel.accel;
  DSEC_ASSIGN_OR_RETURN(std::string kernel_dir, backends::vm::findGuestKernelDir());
  config.kernel = kernel_dir + "/vmlinux";
  DSEC_ASSIGN_OR_RETURN(std::string busybox, findStaticBusybox());
  DSEC_TRY(makeDirs(dir, 0700));
  config.initramfs = dir + "/bench-peer-initramfs.cpio";
  DSEC_TRY(writePeerInitramfs(config.initramfs, busybox));
  return config;
}

double ratio(double a, double b) { return b > 0 ? a / b : 0; }
double rounded(double v) { return std::round(v * 100) / 100; }

void printSamples(const char* label, const Samples& s, int count) {
  std::printf("%-8s p50 %9.2f ms  p99 %9.2f ms  (%zu of %d", label, s.p50(), s.p99(), s.ms.size(), count);
  if (s.failures > 0) std::printf(", %d failed: %s", s.failures, s.first_error.c_str());
  std::printf(")");
  if (!s.create_ms.empty()) std::printf("; the create alone p50 %.2f ms", percentile(s.create_ms, 50));
  std::printf("\n");
}

}  // namespace

int benchMachineCreate(const Invocation& inv, const MachineCreateOptions& options) {
  auto kind = backends::parseBackendKind(options.backend);
  if (!kind.ok()) return reportError(inv, kind.error());
  auto target = openBenchTarget(options.target);
  if (!target.ok()) return reportError(inv, target.error());
  ApiClient client(target->address);
  if (Status usable = requireNodeBackend(client, options.backend); !usable.ok()) {
    if (target->node) target->node->stop(true);
    return reportError(inv, usable.error());
  }
  nlohmann::json create_body{{"image", target->image}, {"backend", options.backend}};
  if (options.memory_bytes > 0) create_body["memory"] = options.memory_bytes;
  const int count = options.count;
  std::cout << "bench create: " << count << " x " << target->image << " (" << options.backend
            << "), one at a time, against " << target->address.endpoint << "; load " << loadAverages() << "\n";
  std::fflush(stdout);

  Progress progress("bench create");
  progress.step("cold: create and first exec", count);
  Samples cold = createExecDestroy(client, create_body, count, progress);

  Samples restore;
  std::string source_id;
  progress.step("restore: snapshot a source", 1);
  // The peer gets the guest RAM the sandboxes have (the node's default unless --memory): the source's.
  int64_t guest_memory = options.memory_bytes > 0 ? options.memory_bytes : 512ll << 20;
  auto snapshot = snapshotSource(client, create_body, &source_id, &guest_memory);
  progress.advance();
  if (snapshot.ok()) {
    progress.step("restore: create from the snapshot and first exec", count);
    restore = createExecDestroy(client, {{"snapshot", *snapshot}}, count, progress);
    (void)client.call(HttpMethod::kDelete, "/v1/snapshots/" + percentEncode(*snapshot));
  } else {
    restore.fail("snapshot: " + snapshot.error().message());
  }
  if (!source_id.empty()) (void)client.call(HttpMethod::kDelete, "/v1/sandboxes/" + percentEncode(source_id));
  if (target->node) target->node->stop(true);

  Samples peers;
  auto peer = peerConfig(*kind, guest_memory, options.target.root);
  if (peer.ok()) {
    progress.step("peer: plain QEMU boots to a marker", count);
    peers = bootPeers(*peer, count, progress);
    unlink(peer->initramfs.c_str());
  } else {
    peers.fail(peer.error().message());
  }
  progress.finish();

  printSamples("cold", cold, count);
  printSamples("restore", restore, count);
  printSamples("peer", peers, count);
  std::printf("%s, %s, guest RAM %lld MiB; each sample one at a time, its sandbox destroyed after it\n",
              options.backend.c_str(), peer.ok() ? peer->accel.c_str() : "?",
              static_cast<long long>(guest_memory >> 20));
  std::printf("restore/peer p50 %.3f  cold/peer p50 %.3f  (peer: plain QEMU, same machine, accel, kernel)\n",
              ratio(restore.p50(), peers.p50()), ratio(cold.p50(), peers.p50()));
  const std::string accel = peer.ok() ? peer->accel : "?";
  const bool target_met = !restore.ms.empty() && restore.failures == 0 && restore.p50() <= kRestoreTargetMs;
  std::printf("target restore to first exec p50 <= %.0f ms under TCG: %s (%.2f ms, %s)\n", kRestoreTargetMs,
              target_met ? "met" : "NOT met", restore.p50(), accel.c_str());
  std::printf("load at the end: %s\n", loadAverages().c_str());
  nlohmann::json summary{{"backend", options.backend},
                         {"accel", accel},
                         {"count", count},
                         {"cold_p50_ms", rounded(cold.p50())},
                         {"cold_p99_ms", rounded(cold.p99())},
                         {"restore_p50_ms", rounded(restore.p50())},
                         {"restore_p99_ms", rounded(restore.p99())},
                         {"peer_p50_ms", rounded(peers.p50())},
                         {"peer_p99_ms", rounded(peers.p99())},
                         {"restore_over_peer", std::round(ratio(restore.p50(), peers.p50()) * 1000) / 1000},
                         {"cold_over_peer", std::round(ratio(cold.p50(), peers.p50()) * 1000) / 1000},
                         {"restore_target_ms", kRestoreTargetMs},
                         {"restore_target_met", target_met},
                         {"failures", cold.failures + restore.failures + peers.failures}};
  std::fflush(stdout);
  std::cout << summary.dump() << std::endl;
  return cold.failures + restore.failures + peers.failures == 0 ? kExitOk : kExitFailure;
}

}  // namespace dsec::cli
