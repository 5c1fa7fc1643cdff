// RFC 6455 WebSocket, as the terminal route and its clients (the gateway's tunnel does not parse frames) need
// it: the opening handshake's key check and answer, frames out, and an incremental decoder that takes bytes as
// they arrive and gives whole messages (fragments joined, control frames between them), so one poll() loop can
// serve a socket and a terminal at once. dsec's HTTP server is its own, on blocking sockets with poll(); Beast's
// websocket::stream needs an asio executor and reads whole messages, which that loop cannot wait on.
//
// Limits: a message over max_message bytes is refused before it is buffered (close 1009); frames a server gets
// must be masked and frames a client gets must not be (1002), reserved bits must be clear, control frames
// must be whole and at most 125 bytes.
#pragma once

#include <boost/beast/http.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "dsec/common/Result.h"

namespace dsec::launcher::ws {

enum class Opcode : uint8_t { kContinuation = 0, kText = 1, kBinary = 2, kClose = 8, kPing = 9, kPong = 10 };

// Close codes (RFC 6455 7.4.1).
constexpr uint16_t kCloseNormal = 1000;
constexpr uint16_t kCloseGoingAway = 1001;
constexpr uint16_t kCloseProtocolError = 1002;
constexpr uint16_t kCloseTooBig = 1009;
constexpr uint16_t kCloseInternal = 1011;

// The Sec-WebSocket-Accept value for a client's Sec-WebSocket-Key.
std::string acceptKey(std::string_view client_key);
// Checks an opening handshake request (GET, Upgrade: websocket, Connection: upgrade, version 13, a key of 16
// base64 bytes) and returns its key; kInvalidArgument says what is missing.
Result<std::string> checkUpgradeRequest(const boost::beast::http::request_header<>& head);
// A fresh random Sec-WebSocket-Key (clients).
std::string newClientKey();

// One whole frame (FIN set). mask: the 4-byte masking key of a client's frame; null for a server's.
void encodeFrame(Opcode op, std::string_view payload, std::string* out, const uint8_t* mask = nullptr);
// A client frame with a fresh random mask.
void encodeClientFrame(Opcode op, std::string_view payload, std::string* out);
// A close frame's payload: the code, then the reason (cut to fit a control frame).
std::string closePayload(uint16_t code, std::string_view reason);

struct Message {
  Opcode op = Opcode::kBinary;  // kText, kBinary, kClose, kPing or kPong
  std::string payload;          // unmasked
};

// A protocol failure: the close code to send, and why.
struct Violation {
  uint16_t close_code = kCloseProtocolError;
  std::string reason;
};

class Decoder {
 public:
  // masked: the peer must mask its frames (a server's decoder); max_message: the largest message taken.
  Decoder(bool masked, uint64_t max_message) : masked_(masked), max_message_(max_message) {}
  void feed(const char* data, size_t size) { buf_.append(data, size); }
  // The next whole message, nullopt when more bytes are needed, or the violation (the stream is then dead).
  std::optional<Message> next();
  const std::optional<Violation>& violation() const { return violation_; }

 private:
  std::optional<Message> fail(uint16_t code, std::string reason);

  const bool masked_;
  const uint64_t max_message_;
  std::string buf_;
  size_t pos_ = 0;
  // A fragmented data message under way.
  bool in_message_ = false;
  Opcode message_op_ = Opcode::kBinary;
  std::string message_;
  std::optional<Violation> violation_;
};

}  // namespace dsec::launcher::ws
