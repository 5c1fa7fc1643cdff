#include "dsec/launcher/api/PolicyRequests.h"

#include "dsec/launcher/api/Requests.h"

namespace dsec::launcher {

using nlohmann::json;

Result<std::vector<std::string>> parseStringList(const json& v, const std::string& field) {
  if (!v.is_array()) return fieldError(field, "expected an array of strings, got " + jsonTypeName(v));
  std::vector<std::string> out;
  for (const auto& item : v) {
    if (!item.is_string()) return fieldError(field, "expected an array of strings, found " + jsonTypeName(item));
    out.push_back(item.get<std::string>());
  }
  return out;
}

Result<backends::EgressPolicy> parseNetworkBody(const json& body) {
  if (!body.is_object()) return Error::invalid("expected {\"egress\": [...]}");
  for (const auto& [key, value] : body.items()) {
    if (key != "egress") return fieldError(key, "unknown field (the network takes \"egress\")");
  }
  if (!body.contains("egress")) return fieldError("egress", "required: the destinations allowed ([] for none)");
  DSEC_ASSIGN_OR_RETURN(std::vector<std::string> entries, parseStringList(body["egress"], "egress"));
  auto policy = backends::parseEgressPolicy(entries);
  if (!policy.ok()) return fieldError("egress", policy.error().message());
  return policy;
}

Result<std::vector<std::string>> parseProtectBody(const json& body) {
  if (!body.is_object()) return Error::invalid("expected {\"paths\": [...]}");
  for (const auto& [key, value] : body.items()) {
    if (key != "paths") return fieldError(key, "unknown field (protect takes \"paths\")");
  }
  if (!body.contains("paths")) return fieldError("paths", "required: the paths to protect ([] for none)");
  DSEC_ASSIGN_OR_RETURN(std::vector<std::string> paths, parseStringList(body["paths"], "paths"));
  auto normal = backends::parseProtectedPaths(paths);
  if (!normal.ok()) return fieldError("paths", normal.error().message());
  return normal;
}

json violationsJson(const std::vector<backends::Violation>& violations) {
  json list = json::array();
  for (const auto& v : violations) {
    list.push_back({{"time", v.time_unix},
                    {"kind", backends::violationKindName(v.kind)},
                    {"target", v.target},
                    {"detail", v.detail}});
  }
  return {{"violations", std::move(list)}, {"count", violations.size()}};
}

}  // namespace dsec::launcher
