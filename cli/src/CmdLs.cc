// dsec ls [--label K=V]...: the fleet's sandboxes as a table (ID IMAGE STATE AGE MEM), or JSON with --json.
#include <ctime>
#include <iostream>

#include "ClientCommon.h"
#include "Commands.h"
#include "Table.h"
#include "dsec/common/Strings.h"

namespace dsec::cli {

int cmdLs(const Invocation& inv) {
  CommonOptions common;
  po::options_description desc("options");
  addCommonOptions(desc, &common, true);
  desc.add_options()("label", po::value<std::vector<std::string>>()->composing(),
                     "K=V: only sandboxes with this label (repeatable; all must match)")(
      "json", po::bool_switch(), "print the API's JSON instead of a table");
  po::variables_map vm;
  if (!parseCommandLine(inv, inv.args, desc, {}, "[--label K=V]...", &vm, &common)) return kExitOk;
  std::string target = "/v1/sandboxes";
  if (vm.count("label") != 0) {
    char sep = '?';
    for (const auto& [key, value] : parseKeyValues("label", vm["label"].as<std::vector<std::string>>())) {
      target += sep + std::string("label=") + percentEncode(key + "=" + value);
      sep = '&';
    }
  }
  auto client = connectFleet(common);
  if (!client.ok()) return reportError(inv, client.error());
  auto listing = (*client)->call(HttpMethod::kGet, target);
  if (!listing.ok()) return reportError(inv, listing.error());
  if (vm["json"].as<bool>()) {
    std::cout << listing->dump(2) << "\n";
    return kExitOk;
  }
  Table table({"ID", "IMAGE", "STATE", "AGE", "MEM"});
  double now = static_cast<double>(std::time(nullptr));
  for (const auto& sb : listing->value("sandboxes", nlohmann::json::array())) {
    double created = sb.value("created_unix", now);
    int64_t mem = sb.contains("usage") && sb["usage"].is_object() ? sb["usage"].value("memory_bytes", int64_t{0}) : 0;
    table.add({sb.value("id", "?"), sb.value("image", "?"), sb.value("state", "?"), formatAge(now - created),
               formatBytes(mem)});
  }
  table.print(std::cout);
  return kExitOk;
}

}  // namespace dsec::cli
