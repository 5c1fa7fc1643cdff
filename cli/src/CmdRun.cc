// dsec run IMAGE [limits] [-- CMD...]: create a sandbox; with a command, run it, print its output, destroy the
// sandbox (unless --keep) and exit with the command's exit code. --snapshot NAME instead of IMAGE restores a
// snapshot (CmdSnapshot.cc makes them).
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <iostream>
#include <memory>
#include <thread>

#include "ClientCommon.h"
#include "Commands.h"
#include "StreamExec.h"
#include "dsec/backends/BackendKind.h"

namespace dsec::cli {

namespace {

// What a restore takes from its snapshot, so that --snapshot refuses them.
constexpr const char* kFixedBySnapshot[] = {"cpus", "memory", "disk", "pids", "env", "network"};

// A restore's body: the snapshot and what a restore may set (timeouts, labels); the rest is the snapshot's.
nlohmann::json restoreBody(const po::variables_map& vm) {
  if (vm.count("image") != 0) {
    throw UsageError("--snapshot takes its image from the snapshot: give no IMAGE (a command goes after --)");
  }
  if (!vm["backend"].defaulted()) throw UsageError("--snapshot takes its backend from the snapshot");
  for (const char* fixed : kFixedBySnapshot) {
    if (vm.count(fixed) != 0) {
      throw UsageError(std::string("--snapshot takes its limits from the snapshot: --") + fixed + " cannot be given");
    }
  }
  nlohmann::json body{{"snapshot", vm["snapshot"].as<std::string>()}};
  for (const char* duration : {"timeout", "idle-timeout"}) {
    if (vm.count(duration) == 0) continue;
    double seconds = vm[duration].as<double>();
    if (!(seconds >= 0)) throw UsageError(std::string("--") + duration + " must be >= 0 seconds");
    body[std::string(duration) == "timeout" ? "timeout" : "idle_timeout"] = seconds;
  }
  if (vm.count("label") != 0) body["labels"] = parseKeyValues("label", vm["label"].as<std::vector<std::string>>());
  return body;
}

// Fills the create body of docs/api.md from the options the user actually gave (the server owns defaults).
nlohmann::json createBody(const po::variables_map& vm) {
  if (vm.count("snapshot") != 0) return restoreBody(vm);
  if (vm.count("image") == 0) throw UsageError("missing IMAGE (or --snapshot NAME to restore one)");
  nlohmann::json body{{"image", vm["image"].as<std::string>()}, {"backend", vm["backend"].as<std::string>()}};
  if (vm.count("cpus") != 0) {
    double cpus = vm["cpus"].as<double>();
    if (!(cpus > 0)) throw UsageError("--cpus must be > 0");
    body["cpus"] = cpus;
  }
  for (const char* size : {"memory", "disk"}) {
    if (vm.count(size) != 0) body[size] = parseSizeOption(size, vm[size].as<std::string>());
  }
  if (vm.count("pids") != 0) {
    int64_t pids = vm["pids"].as<int64_t>();
    if (pids < 0) throw UsageError("--pids must be >= 0");
    body["pids"] = pids;
  }
  for (const char* duration : {"timeout", "idle-timeout"}) {
    if (vm.count(duration) == 0) continue;
    double seconds = vm[duration].as<double>();
    if (!(seconds >= 0)) throw UsageError(std::string("--") + duration + " must be >= 0 seconds");
    body[std::string(duration) == "timeout" ? "timeout" : "idle_timeout"] = seconds;
  }
  if (vm.count("env") != 0) body["env"] = parseKeyValues("env", vm["env"].as<std::vector<std::string>>());
  if (vm.count("label") != 0) body["labels"] = parseKeyValues("label", vm["label"].as<std::vector<std::string>>());
  if (vm.count("network") != 0) {
    std::string network = vm["network"].as<std::string>();
    if (network != "none" && network != "egress")
      throw UsageError("--network must be none or egress, got '" + network + "'");
    body["network"] = network;
  }
  return body;
}

}  // namespace

int cmdRun(const Invocation& inv) {
  auto [before, command] = splitAtDoubleDash(inv.args);
  CommonOptions common;
  po::options_description desc("options");
  addCommonOptions(desc, &common, true);
  desc.add_options()("image", po::value<std::string>(), "image: layers bottom first, 'debian:12+py:1'")(
      "snapshot", po::value<std::string>(),
      "restore this snapshot instead of an image (its image, backend and limits; any node of the fleet)")(
      "backend",
      po::value<std::string>()->default_value(dsec::backends::backendKindName(dsec::backends::BackendKind::kContainer)),
      "sandbox backend")("cpus", po::value<double>(), "CPU quota in CPUs (default 1)")(
      "memory", po::value<std::string>(), "memory limit, e.g. 512M (default 512M)")(
      "disk", po::value<std::string>(), "writable layer size, e.g. 1G (default 1G)")(
      "pids", po::value<int64_t>(), "process limit (default 1024)")("timeout", po::value<double>(),
                                                                    "destroy after this many seconds (0 = never)")(
      "idle-timeout", po::value<double>(), "destroy after this many idle seconds (0 = never)")(
      "env", po::value<std::vector<std::string>>()->composing(), "K=V default environment (repeatable)")(
      "label", po::value<std::vector<std::string>>()->composing(), "K=V label (repeatable)")(
      "network", po::value<std::string>(),
      "none (default, loopback only) or egress (a route out through the node, never to it)")(
      "keep", po::bool_switch(), "with a command: keep the sandbox afterwards")(
      "exec-timeout", po::value<double>()->default_value(0), "with a command: kill it after this many seconds")(
      "cmd", po::value<std::vector<std::string>>(), "command (prefer after --)");
  po::positional_options_description positional;
  positional.add("image", 1).add("cmd", -1);
  po::variables_map vm;
  if (!parseCommandLine(inv, before, desc, positional, "(IMAGE | --snapshot NAME) [options] [-- CMD...]", &vm, &common))
    return kExitOk;
  if (vm.count("cmd") != 0) {
    auto extra = vm["cmd"].as<std::vector<std::string>>();
    command.insert(command.begin(), extra.begin(), extra.end());
  }
  nlohmann::json body = createBody(vm);

  auto address = resolveFleet(common.fleet, common.fleet_given);
  if (!address.ok()) return reportError(inv, address.error());
  bool keep = vm["keep"].as<bool>();
  // With a command whose sandbox is ours to destroy, Ctrl-C (or SIGTERM/SIGHUP) must not leave it behind: the
  // signals go to a watcher thread that destroys the sandbox and exits as if killed.
  sigset_t signals;
  sigemptyset(&signals);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&signals, sig);
  if (!command.empty() && !keep) pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  auto client = std::make_unique<ApiClient>(*address);
  auto info = client->call(HttpMethod::kPost, "/v1/sandboxes", body);
  if (!info.ok()) return reportError(inv, info.error());
  std::string id = info->value("id", "");
  if (command.empty()) {
    std::cout << id << "\n";
    return kExitOk;
  }
  // Set by the watcher before it destroys the sandbox: the exec then ends (killed) and the main thread must
  // leave the exit to the watcher, which reports the interruption and exits as if killed by the signal.
  auto interrupted = std::make_shared<std::atomic<bool>>(false);
  if (!keep) {
    std::thread([address = *address, id, signals, interrupted] {
      int sig = 0;
      if (sigwait(&signals, &sig) != 0) return;
      interrupted->store(true);
      ApiClient destroyer(address);
      (void)destroyer.call(HttpMethod::kDelete, sandboxPath(id));
      std::cerr << "\ndsec run: interrupted; destroyed sandbox " << id << "\n";
      _exit(128 + sig);
    }).detach();
  }
  nlohmann::json exec{{"cmd", command}};
  if (vm["exec-timeout"].as<double>() > 0) exec["timeout"] = vm["exec-timeout"].as<double>();
  auto result = streamExec(*client, id, exec);
  while (interrupted->load()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (keep) {
    std::cerr << "dsec run: kept sandbox " << id << "\n";
  } else {
    auto destroyed = client->call(HttpMethod::kDelete, sandboxPath(id));
    if (!destroyed.ok()) reportError(inv, destroyed.error().wrap("destroying " + id));
  }
  if (!result.ok()) return reportError(inv, result.error());
  return exitCodeOf(*result, inv.name);
}

}  // namespace dsec::cli
