#include "dsec/launcher/api/ConnectEnvelope.h"

namespace dsec::launcher {

std::string connectFrame(uint8_t flags, std::string_view json) {
  std::string out;
  out.reserve(5 + json.size());
  out.push_back(static_cast<char>(flags));
  const auto n = static_cast<uint32_t>(json.size());
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>((n >> shift) & 0xff));
  out.append(json);
  return out;
}

Result<std::vector<ConnectMessage>> parseConnectFrames(std::string_view body, size_t max_message) {
  std::vector<ConnectMessage> out;
  while (!body.empty()) {
    if (body.size() < 5) return Error::invalid("a Connect envelope is cut short");
    ConnectMessage m;
    m.flags = static_cast<uint8_t>(body[0]);
    uint32_t n = 0;
    for (int i = 1; i <= 4; ++i) n = (n << 8) | static_cast<uint8_t>(body[static_cast<size_t>(i)]);
    if ((m.flags & kConnectCompressed) != 0) return Error::invalid("a compressed Connect message (none was agreed)");
    if (n > max_message) return Error::invalid("a Connect message of " + std::to_string(n) + " bytes is too large");
    if (body.size() - 5 < n) return Error::invalid("a Connect message is cut short");
    m.json.assign(body.substr(5, n));
    body.remove_prefix(5 + n);
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace dsec::launcher
