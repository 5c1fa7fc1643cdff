#include "dsec/launcher/node/NodeName.h"

#include <cctype>

namespace dsec::launcher {

Status validateNodeName(const std::string& name) {
  if (name.empty() || name.size() > kMaxNodeNameLength ||
      name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-") != std::string::npos || name[0] == '-') {
    return Error::invalid("node name '" + name + "': use 1-32 of [a-z0-9-], not starting with '-'");
  }
  return okStatus();
}

std::string nodeNameFrom(const std::string& raw) {
  std::string out;
  for (char c : raw) {
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    out.push_back(std::isalnum(static_cast<unsigned char>(c)) ? c : '-');
  }
  while (!out.empty() && out[0] == '-') out.erase(0, 1);
  if (out.size() > kMaxNodeNameLength) out.resize(kMaxNodeNameLength);
  return out.empty() ? "node" : out;
}

}  // namespace dsec::launcher
