// RFC 6455 framing and handshake (WebSocket.h).
#include "dsec/launcher/api/WebSocket.h"

#include <openssl/sha.h>
#include <sys/random.h>

#include <boost/beast/core/string.hpp>
#include <cstring>

#include "dsec/common/Base64.h"

namespace dsec::launcher::ws {
namespace {

namespace http = boost::beast::http;
constexpr char kGuid[] = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

// Whether a comma-separated header value lists token (case-insensitive).
bool listsToken(std::string_view value, std::string_view token) {
  size_t start = 0;
  while (start <= value.size()) {
    size_t end = value.find(',', start);
    if (end == std::string_view::npos) end = value.size();
    std::string_view item = value.substr(start, end - start);
    while (!item.empty() && (item.front() == ' ' || item.front() == '\t')) item.remove_prefix(1);
    while (!item.empty() && (item.back() == ' ' || item.back() == '\t')) item.remove_suffix(1);
    if (boost::beast::iequals(boost::beast::string_view(item.data(), item.size()),
                              boost::beast::string_view(token.data(), token.size()))) {
      return true;
    }
    start = end + 1;
  }
  return false;
}

void randomBytes(uint8_t* out, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = getrandom(out + got, n - got, 0);
    if (r > 0) got += static_cast<size_t>(r);
  }
}

}  // namespace

std::string acceptKey(std::string_view client_key) {
  std::string text = std::string(client_key) + kGuid;
  unsigned char digest[SHA_DIGEST_LENGTH];
  SHA1(reinterpret_cast<const unsigned char*>(text.data()), text.size(), digest);
  return base64Encode(std::string_view(reinterpret_cast<const char*>(digest), sizeof digest));
}

Result<std::string> checkUpgradeRequest(const http::request_header<>& head) {
  if (head.method() != http::verb::get) return Error::invalid("a WebSocket handshake is a GET");
  if (!boost::beast::iequals(head[http::field::upgrade], "websocket")) {
    return Error::invalid("this route is a WebSocket: the request needs Upgrade: websocket");
  }
  const auto connection = head[http::field::connection];
  if (!listsToken(std::string_view(connection.data(), connection.size()), "upgrade")) {
    return Error::invalid("a WebSocket handshake needs Connection: Upgrade");
  }
  if (head[http::field::sec_websocket_version] != "13") {
    return Error::invalid("only WebSocket version 13 is spoken (Sec-WebSocket-Version: 13)");
  }
  std::string key(head[http::field::sec_websocket_key]);
  auto raw = base64Decode(key);
  if (!raw.ok() || raw->size() != 16) return Error::invalid("Sec-WebSocket-Key must be 16 bytes in base64");
  return key;
}

std::string newClientKey() {
  uint8_t raw[16];
  randomBytes(raw, sizeof raw);
  return base64Encode(std::string_view(reinterpret_cast<const char*>(raw), sizeof raw));
}

void encodeFrame(Opcode op, std::string_view payload, std::string* out, const uint8_t* mask) {
  out->push_back(static_cast<char>(0x80 | static_cast<uint8_t>(op)));
  const uint8_t mask_bit = mask != nullptr ? 0x80 : 0;
  const uint64_t n = payload.size();
  if (n < 126) {
    out->push_back(static_cast<char>(mask_bit | n));
  } else if (n <= 0xFFFF) {
    out->push_back(static_cast<char>(mask_bit | 126));
    out->push_back(static_cast<char>(n >> 8));
    out->push_back(static_cast<char>(n & 0xFF));
  } else {
    out->push_back(static_cast<char>(mask_bit | 127));
    for (int shift = 56; shift >= 0; shift -= 8) out->push_back(static_cast<char>((n >> shift) & 0xFF));
  }
  if (mask == nullptr) {
    out->append(payload);
    return;
  }
  out->append(reinterpret_cast<const char*>(mask), 4);
  const size_t at = out->size();
  out->append(payload);
  for (size_t i = 0; i < payload.size(); ++i) (*out)[at + i] = static_cast<char>((*out)[at + i] ^ mask[i % 4]);
}

void encodeClientFrame(Opcode op, std::string_view payload, std::string* out) {
  uint8_t mask[4];
  randomBytes(mask, sizeof mask);
  encodeFrame(op, payload, out, mask);
}

std::string closePayload(uint16_t code, std::string_view reason) {
  std::string p;
  p.push_back(static_cast<char>(code >> 8));
  p.push_back(static_cast<char>(code & 0xFF));
  p.append(reason.substr(0, 123));
  return p;
}

std::optional<Message> Decoder::fail(uint16_t code, std::string reason) {
  violation_ = Violation{code, std::move(reason)};
  buf_.clear();
  pos_ = 0;
  return std::nullopt;
}

std::optional<Message> Decoder::next() {
  while (!violation_) {
    // Bytes already decoded are dropped now and then, not on every frame.
    if (pos_ > 0 && (pos_ == buf_.size() || pos_ > 65536)) {
      buf_.erase(0, pos_);
      pos_ = 0;
    }
    const size_t avail = buf_.size() - pos_;
    if (avail < 2) return std::nullopt;
    const auto* p = reinterpret_cast<const uint8_t*>(buf_.data() + pos_);
    const bool fin = (p[0] & 0x80) != 0;
    if ((p[0] & 0x70) != 0) return fail(kCloseProtocolError, "reserved bits set (no extension was agreed)");
    const uint8_t raw_op = p[0] & 0x0F;
    const bool is_masked = (p[1] & 0x80) != 0;
    if (is_masked != masked_) {
      return fail(kCloseProtocolError, masked_ ? "client frames must be masked" : "server frames must not be masked");
    }
    uint64_t len = p[1] & 0x7F;
    size_t header = 2;
    if (len == 126) {
      if (avail < 4) return std::nullopt;
      len = (uint64_t{p[2]} << 8) | p[3];
      header = 4;
    } else if (len == 127) {
      if (avail < 10) return std::nullopt;
      len = 0;
      for (int i = 0; i < 8; ++i) len = (len << 8) | p[2 + i];
      if ((len >> 63) != 0) return fail(kCloseProtocolError, "frame length has its top bit set");
      header = 10;
    }
    const bool control = (raw_op & 0x8) != 0;
    if (control) {
      if (raw_op != 8 && raw_op != 9 && raw_op != 10) return fail(kCloseProtocolError, "unknown control opcode");
      if (!fin || len > 125) return fail(kCloseProtocolError, "control frames must be whole and at most 125 bytes");
    } else {
      if (raw_op != 0 && raw_op != 1 && raw_op != 2) return fail(kCloseProtocolError, "unknown data opcode");
      if (raw_op == 0 && !in_message_) return fail(kCloseProtocolError, "a continuation frame without a message");
      if (raw_op != 0 && in_message_) return fail(kCloseProtocolError, "a new message inside a fragmented one");
      // Refused on the header: an oversized message is never buffered.
      if (len > max_message_ || message_.size() + len > max_message_) {
        return fail(kCloseTooBig, "message over " + std::to_string(max_message_) + " bytes");
      }
    }
    if (is_masked) header += 4;
    if (avail < header + len) return std::nullopt;
    std::string payload(buf_.data() + pos_ + header, static_cast<size_t>(len));
    if (is_masked) {
      const uint8_t* mask = p + header - 4;
      for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<char>(payload[i] ^ mask[i % 4]);
    }
    pos_ += header + static_cast<size_t>(len);
    if (control) return Message{static_cast<Opcode>(raw_op), std::move(payload)};
    if (raw_op != 0) {
      message_op_ = static_cast<Opcode>(raw_op);
      message_.clear();
    }
    message_ += payload;
    in_message_ = !fin;
    if (fin) return Message{message_op_, std::exchange(message_, std::string())};
  }
  return std::nullopt;
}

}  // namespace dsec::launcher::ws
