// dsec snapshot create|ls|rm and dsec fork: a sandbox's state kept in the fleet's shared snapshot store, listed,
// removed, and copied into new sandboxes (docs/api.md, "Snapshots, restores and forks"). A restore is
// `dsec run --snapshot NAME` (CmdRun.cc).
#include <ctime>
#include <iostream>

#include "ClientCommon.h"
#include "Commands.h"
#include "Table.h"
#include "dsec/common/Strings.h"

namespace dsec::cli {
namespace {

// The most copies one fork makes (the node's own limit).
constexpr int kMaxForks = 256;

int snapshotCreate(const Invocation& inv) {
  SandboxCommandLine line;
  line.desc.add_options()("name", po::value<std::string>(), "the snapshot's name (default: one the node picks)")(
      "processes", po::bool_switch(), "keep its processes too (machine sandboxes; a container's holds files only)")(
      "json", po::bool_switch(), "print the snapshot object as JSON");
  if (!line.parse(inv, inv.args, "SANDBOX [--name NAME] [--processes]")) return kExitOk;
  nlohmann::json body = nlohmann::json::object();
  if (line.vm.count("name") != 0) body["name"] = line.vm["name"].as<std::string>();
  if (line.vm["processes"].as<bool>()) body["processes"] = true;
  auto client = connectFleet(line.common);
  if (!client.ok()) return reportError(inv, client.error());
  auto snap = (*client)->call(HttpMethod::kPost, sandboxPath(line.id()) + "/snapshot", body);
  if (!snap.ok()) return reportError(inv, snap.error());
  if (line.vm["json"].as<bool>()) {
    std::cout << snap->dump(2) << "\n";
  } else {
    std::cout << snap->value("name", "?") << "\n";
  }
  return kExitOk;
}

int snapshotLs(const Invocation& inv) {
  CommonOptions common;
  po::options_description desc("options");
  addCommonOptions(desc, &common, true);
  desc.add_options()("json", po::bool_switch(), "print the API's JSON instead of a table");
  po::variables_map vm;
  if (!parseCommandLine(inv, inv.args, desc, {}, "[--json]", &vm, &common)) return kExitOk;
  auto client = connectFleet(common);
  if (!client.ok()) return reportError(inv, client.error());
  auto listing = (*client)->call(HttpMethod::kGet, "/v1/snapshots");
  if (!listing.ok()) return reportError(inv, listing.error());
  if (vm["json"].as<bool>()) {
    std::cout << listing->dump(2) << "\n";
    return kExitOk;
  }
  Table table({"NAME", "KIND", "IMAGE", "SOURCE", "NODE", "AGE", "SIZE"});
  double now = static_cast<double>(std::time(nullptr));
  for (const auto& s : listing->value("snapshots", nlohmann::json::array())) {
    table.add({s.value("name", "?"), s.value("kind", "?"), s.value("image", "?"), s.value("source", "?"),
               s.value("node", "?"), formatAge(now - s.value("created_unix", now)),
               formatBytes(s.value("bytes", int64_t{0}))});
  }
  table.print(std::cout);
  return kExitOk;
}

// Keeps going past failures (as `dsec rm` does) and exits 1 if any failed.
int snapshotRm(const Invocation& inv) {
  CommonOptions common;
  po::options_description desc("options");
  addCommonOptions(desc, &common, true);
  desc.add_options()("name", po::value<std::vector<std::string>>(), "snapshot names");
  po::positional_options_description positional;
  positional.add("name", -1);
  po::variables_map vm;
  if (!parseCommandLine(inv, inv.args, desc, positional, "NAME...", &vm, &common)) return kExitOk;
  if (vm.count("name") == 0) throw UsageError("missing snapshot name");
  auto client = connectFleet(common);
  if (!client.ok()) return reportError(inv, client.error());
  int status = kExitOk;
  for (const auto& name : vm["name"].as<std::vector<std::string>>()) {
    auto done = (*client)->call(HttpMethod::kDelete, "/v1/snapshots/" + percentEncode(name));
    if (!done.ok()) {
      status = reportError(inv, done.error().wrap(name));
    } else {
      std::cout << name << "\n";
    }
  }
  return status;
}

}  // namespace

int cmdSnapshot(const Invocation& inv) {
  static const std::pair<const char*, int (*)(const Invocation&)> kSubcommands[] = {
      {"create", snapshotCreate}, {"ls", snapshotLs}, {"rm", snapshotRm}};
  if (inv.args.empty() || inv.args[0] == "--help" || inv.args[0] == "-h") {
    std::ostream& out = inv.args.empty() ? std::cerr : std::cout;
    out << "usage: dsec snapshot create SANDBOX [--name NAME] [--processes]   (prints the name)\n"
           "       dsec snapshot ls [--json]\n"
           "       dsec snapshot rm NAME...\n"
           "Snapshots live in the fleet's shared snapshot store; any node restores one: dsec run --snapshot NAME.\n";
    if (inv.args.empty()) throw UsageError("missing snapshot command (create, ls, rm)");
    return kExitOk;
  }
  for (const auto& [name, run] : kSubcommands) {
    if (inv.args[0] != name) continue;
    Invocation sub{"snapshot " + inv.args[0], inv.globals,
                   std::vector<std::string>(inv.args.begin() + 1, inv.args.end())};
    try {
      return run(sub);
    } catch (const UsageError& e) {  // named after the full command: "dsec snapshot create: ..."
      std::cerr << "dsec " << sub.name << ": " << e.what() << "\n(see `dsec " << sub.name << " --help`)\n";
      return kExitUsage;
    }
  }
  throw UsageError("unknown snapshot command '" + inv.args[0] + "' (create, ls, rm)");
}

int cmdFork(const Invocation& inv) {
  SandboxCommandLine line;
  line.desc.add_options()("count,n", po::value<int>()->default_value(1), "how many copies (1..256)")(
      "processes", po::bool_switch(), "copy its processes too (machine sandboxes)")(
      "json", po::bool_switch(), "print the API's answer (the snapshot and the copies' infos) as JSON");
  if (!line.parse(inv, inv.args, "SANDBOX [-n COUNT] [--processes]")) return kExitOk;
  int count = line.vm["count"].as<int>();
  if (count < 1 || count > kMaxForks) {
    throw UsageError("--count must be 1.." + std::to_string(kMaxForks) + ", got " + std::to_string(count));
  }
  nlohmann::json body{{"count", count}};
  if (line.vm["processes"].as<bool>()) body["processes"] = true;
  auto client = connectFleet(line.common);
  if (!client.ok()) return reportError(inv, client.error());
  auto forked = (*client)->call(HttpMethod::kPost, sandboxPath(line.id()) + "/fork", body);
  if (!forked.ok()) return reportError(inv, forked.error());
  if (line.vm["json"].as<bool>()) {
    std::cout << forked->dump(2) << "\n";
    return kExitOk;
  }
  for (const auto& info : forked->value("sandboxes", nlohmann::json::array())) {
    std::cout << info.value("id", "?") << "\n";
  }
  return kExitOk;
}

}  // namespace dsec::cli
