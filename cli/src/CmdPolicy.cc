// Stages of a running sandbox from the shell:
//   dsec network ID [--egress DEST]...   replaces its egress policy (none given: no egress at all)
//   dsec protect ID [PATH]...            replaces its protected paths (none given: nothing protected)
//   dsec violations ID                   prints what its processes were refused
#include <iomanip>
#include <iostream>

#include "ClientCommon.h"
#include "Commands.h"

namespace dsec::cli {
namespace {

using nlohmann::json;

// Parses ID and the command's list option (repeated or positional after ID), connects, and PUTs {key: list}.
int putList(const Invocation& inv, const std::string& route, const std::string& key, const char* list_option,
            const char* list_help) {
  SandboxCommandLine line;
  line.desc.add_options()(list_option, po::value<std::vector<std::string>>()->composing(), list_help);
  line.positional.add(list_option, -1);
  if (!line.parse(inv, inv.args, std::string("ID [") + list_option + "]...")) return kExitOk;
  auto client = connectFleet(line.common);
  if (!client.ok()) return reportError(inv, client.error());
  const std::string id = line.id();
  const po::variables_map& vm = line.vm;
  std::vector<std::string> values;
  if (vm.count(list_option) != 0) values = vm[list_option].as<std::vector<std::string>>();
  auto info = (*client)->call(HttpMethod::kPut, sandboxPath(id) + "/" + route, json{{key, values}});
  if (!info.ok()) return reportError(inv, info.error());
  json now = info->value(key == "egress" ? "egress" : "protect", json::array());
  std::cout << id << " " << route << ": " << (now.is_array() && !now.empty() ? now.dump() : "[] (none)") << "\n";
  return kExitOk;
}

}  // namespace

int cmdNetwork(const Invocation& inv) {
  return putList(inv, "network", "egress", "egress",
                 "an allowed destination: 10.0.0.0/8, 192.0.2.1:443, pypi.org:443, *.example.org (repeatable; none "
                 "= no egress)");
}

int cmdProtect(const Invocation& inv) {
  return putList(inv, "protect", "paths", "path", "a path its processes cannot change (repeatable; none = none)");
}

int cmdViolations(const Invocation& inv) {
  SandboxCommandLine line;
  bool as_json = false;
  line.desc.add_options()("json", po::bool_switch(&as_json), "print the JSON document");
  if (!line.parse(inv, inv.args, "ID")) return kExitOk;
  auto client = connectFleet(line.common);
  if (!client.ok()) return reportError(inv, client.error());
  auto doc = (*client)->call(HttpMethod::kGet, sandboxPath(line.id()) + "/violations");
  if (!doc.ok()) return reportError(inv, doc.error());
  if (as_json) {
    std::cout << doc->dump(2) << "\n";
    return kExitOk;
  }
  for (const auto& v : doc->value("violations", json::array())) {
    std::cout << std::fixed << std::setprecision(3) << v.value("time", 0.0) << "  " << v.value("kind", "?") << "  "
              << v.value("target", "") << "  " << v.value("detail", "") << "\n";
  }
  return kExitOk;
}

}  // namespace dsec::cli
