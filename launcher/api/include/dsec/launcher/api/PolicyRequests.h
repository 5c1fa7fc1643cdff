// The API edge of sandbox policies: egress rules and protected paths as JSON, at create and for a running sandbox
// (PUT .../network, PUT .../protect), and the refusals (GET .../violations).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dsec/backends/NetworkPolicy.h"
#include "dsec/common/Result.h"

namespace dsec::launcher {

// A JSON array of strings; 400 naming the field otherwise.
Result<std::vector<std::string>> parseStringList(const nlohmann::json& v, const std::string& field);
// {"egress": ["10.0.0.0/8", "pypi.org:443", ...]}: the body of PUT .../network, and the object form of a create's
// "network".
Result<backends::EgressPolicy> parseNetworkBody(const nlohmann::json& body);
// {"paths": ["/workspace/tests", "/usr"]}: the body of PUT .../protect.
Result<std::vector<std::string>> parseProtectBody(const nlohmann::json& body);
// {"violations": [{"time", "kind", "target", "detail"}, ...], "count"}
nlohmann::json violationsJson(const std::vector<backends::Violation>& violations);

}  // namespace dsec::launcher
