// The Connect protocol's envelopes (connectrpc.com/docs/protocol), as E2B's envd speaks it over HTTP/1.1 with the
// JSON codec: a streaming message is [flags: 1 byte][length: u32 big-endian][JSON]; flags 0x02 marks the
// end-of-stream message, whose JSON may carry {"error": {"code", "message"}}. Unary calls are plain JSON bodies.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dsec/common/Result.h"

namespace dsec::launcher {

inline constexpr uint8_t kConnectEndStream = 0x02;
inline constexpr uint8_t kConnectCompressed = 0x01;

struct ConnectMessage {
  uint8_t flags = 0;
  std::string json;
};

std::string connectFrame(uint8_t flags, std::string_view json);
// Every envelope of a whole body, in order; kInvalidArgument for a truncated one, a compressed one (none was
// negotiated) or one over max_message bytes.
Result<std::vector<ConnectMessage>> parseConnectFrames(std::string_view body, size_t max_message = 4u << 20);

}  // namespace dsec::launcher
