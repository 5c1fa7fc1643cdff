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

namespace {

// A body of exactly one field, a list of strings: {"<field>": [...]} (what names what the list is for).
Result<std::vector<std::string>> parseListBody(const json& body, const std::string& field, const std::string& what,
                                               const std::string& meaning) {
  if (!body.is_object()) return Error::invalid("expected {\"" + field + "\": [...]}");
  for (const auto& [key, value] : body.items()) {
    if (key != field) return fieldError(key, "unknown field (" + what + " takes \"" + field + "\")");
  }
  if (!body.contains(field)) return fieldError(field, "required: " + meaning + " ([] for none)");
  return parseStringList(body[field], field);
}

}  // namespace

Result<backends::EgressPolicy> parseNetworkBody(const json& body) {
  DSEC_ASSIGN_OR_RETURN(std::vector<std::string> entries,
                        parseListBody(body, "egress", "the network", "the destinations allowed"));
  auto policy = backends::parseEgressPolicy(entries);
  if (!policy.ok()) return fieldError("egress", policy.error().message());
  return policy;
}

Result<std::vector<std::string>> parseProtectBody(const json& body) {
  DSEC_ASSIGN_OR_RETURN(std::vector<std::string> paths,
                        parseListBody(body, "paths", "protect", "the paths to protect"));
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
