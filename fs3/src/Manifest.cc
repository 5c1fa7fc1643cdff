#include "Manifest.h"

#include <time.h>

#include <nlohmann/json.hpp>

#include "dsec/common/Strings.h"

namespace dsec::fs3 {

nlohmann::json LayerManifest::toJson() const {
  return {{"name", ref.name},   {"version", ref.version}, {"sha256", sha256}, {"size", size},
          {"created", created}, {"built_on", built_on},   {"source", source}};
}

std::string manifestToJson(const LayerManifest& m) { return m.toJson().dump(2) + "\n"; }

Result<LayerManifest> manifestFromJson(const std::string& text, const std::string& what) {
  try {
    auto j = nlohmann::json::parse(text);
    LayerManifest m;
    m.ref.name = j.at("name").get<std::string>();
    m.ref.version = j.at("version").get<std::string>();
    m.sha256 = j.at("sha256").get<std::string>();
    m.size = j.at("size").get<int64_t>();
    m.created = j.at("created").get<std::string>();
    m.built_on = j.value("built_on", "");
    m.source = j.value("source", "");
    return m;
  } catch (const nlohmann::json::exception& e) {
    return Error::internal(what + " is corrupt: " + e.what());
  }
}

std::string nowRfc3339() { return rfc3339(static_cast<double>(::time(nullptr))); }

}  // namespace dsec::fs3
