#include "dsec/launcher/node/CreateParams.h"

namespace dsec::launcher {

bool labelsMatch(const std::map<std::string, std::string>& labels, const std::map<std::string, std::string>& want) {
  for (const auto& [k, v] : want) {
    auto it = labels.find(k);
    if (it == labels.end() || it->second != v) return false;
  }
  return true;
}

}  // namespace dsec::launcher
