#include "dsec/backends/BackendKind.h"

#include <array>
#include <utility>

namespace dsec::backends {
namespace {

constexpr std::array<std::pair<BackendKind, const char*>, 4> kNames = {{{BackendKind::kContainer, "container"},
                                                                        {BackendKind::kFncall, "fncall"},
                                                                        {BackendKind::kMicrovm, "microvm"},
                                                                        {BackendKind::kVm, "vm"}}};

}  // namespace

const char* backendKindName(BackendKind kind) {
  for (const auto& [k, name] : kNames) {
    if (k == kind) return name;
  }
  return "unknown";
}

Result<BackendKind> parseBackendKind(std::string_view name) {
  for (const auto& [k, known] : kNames) {
    if (name == known) return k;
  }
  std::string known_list;
  for (const auto& [k, known] : kNames) known_list += std::string(known_list.empty() ? "" : ", ") + known;
  return Error::invalid("unknown backend '" + std::string(name) + "' (known: " + known_list + ")");
}

}  // namespace dsec::backends
