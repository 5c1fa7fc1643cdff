// RFC 6455 framing and handshake (launcher/api WebSocket.h): masking both ways, fragmentation with control
// frames between fragments, close payloads, and what is refused (unmasked client frames, oversize messages
// before they are buffered, bad control frames, reserved bits, stray continuations).
#include <gtest/gtest.h>

#include <string>

#include "dsec/launcher/api/WebSocket.h"

namespace dsec::launcher::ws {
namespace {

namespace http = boost::beast::http;

// A frame built by hand: fin, opcode, payload, optional mask.
std::string rawFrame(bool fin, uint8_t op, const std::string& payload, const uint8_t* mask) {
  std::string out;
  encodeFrame(static_cast<Opcode>(op), payload, &out, mask);
  if (!fin) out[0] = static_cast<char>(out[0] & 0x7F);
  return out;
}

const uint8_t kMask[4] = {0x12, 0x34, 0x56, 0x78};

TEST(WebSocket, AcceptKeyMatchesTheRfcExample) {
  EXPECT_EQ(acceptKey("dGhlIHNhbXBsZSBub25jZQ=="), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
}

TEST(WebSocket, UpgradeRequestIsChecked) {
  http::request_header<> h;
  h.method(http::verb::get);
  h.set(http::field::upgrade, "websocket");
  h.set(http::field::connection, "keep-alive, Upgrade");
  h.set(http::field::sec_websocket_version, "13");
  h.set(http::field::sec_websocket_key, "dGhlIHNhbXBsZSBub25jZQ==");
  auto key = checkUpgradeRequest(h);
  ASSERT_TRUE(key.ok()) << key.error().message();
  EXPECT_EQ(*key, "dGhlIHNhbXBsZSBub25jZQ==");

  auto bad = h;
  bad.set(http::field::sec_websocket_version, "8");
  EXPECT_FALSE(checkUpgradeRequest(bad).ok());
  bad = h;
  bad.set(http::field::connection, "keep-alive");
  EXPECT_FALSE(checkUpgradeRequest(bad).ok());
  bad = h;
  bad.set(http::field::sec_websocket_key, "c2hvcnQ=");  // 5 bytes, not 16
  EXPECT_FALSE(checkUpgradeRequest(bad).ok());
  bad = h;
  bad.erase(http::field::upgrade);
  EXPECT_FALSE(checkUpgradeRequest(bad).ok());
  bad = h;
  bad.method(http::verb::post);
  EXPECT_FALSE(checkUpgradeRequest(bad).ok());
  EXPECT_EQ(newClientKey().size(), 24u);
  EXPECT_NE(newClientKey(), newClientKey());
}

TEST(WebSocket, MaskedClientFramesRoundTripAtEveryLengthForm) {
  for (size_t n : {size_t{0}, size_t{5}, size_t{125}, size_t{126}, size_t{65535}, size_t{65536}, size_t{200000}}) {
    std::string payload(n, '\0');
    for (size_t i = 0; i < n; ++i) payload[i] = static_cast<char>(i * 7);
    std::string wire;
    encodeClientFrame(Opcode::kBinary, payload, &wire);
    if (n > 0) {
      EXPECT_NE(wire.substr(wire.size() - n), payload) << "the payload went out unmasked";
    }
    Decoder d(true, 1 << 20);
    // Byte by byte for small frames: the decoder waits for the rest without losing its place.
    if (n <= 130) {
      for (char c : wire) {
        EXPECT_FALSE(d.next().has_value());
        d.feed(&c, 1);
      }
    } else {
      d.feed(wire.data(), wire.size());
    }
    auto m = d.next();
    ASSERT_TRUE(m.has_value()) << n;
    EXPECT_EQ(m->op, Opcode::kBinary);
    EXPECT_EQ(m->payload, payload);
    EXPECT_FALSE(d.next().has_value());
    EXPECT_FALSE(d.violation().has_value());
  }
}

TEST(WebSocket, ServerFramesAreUnmaskedAndAClientRefusesMaskedOnes) {
  std::string wire;
  encodeFrame(Opcode::kText, "hello", &wire);
  EXPECT_EQ(wire, std::string("\x81\x05hello", 7));
  Decoder client(false, 1024);
  client.feed(wire.data(), wire.size());
  auto m = client.next();
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->payload, "hello");

  std::string masked = rawFrame(true, 1, "hi", kMask);
  Decoder strict(false, 1024);
  strict.feed(masked.data(), masked.size());
  EXPECT_FALSE(strict.next().has_value());
  ASSERT_TRUE(strict.violation().has_value());
  EXPECT_EQ(strict.violation()->close_code, kCloseProtocolError);
}

TEST(WebSocket, UnmaskedClientFramesAreRefused) {
  std::string wire;
  encodeFrame(Opcode::kBinary, "typed", &wire);  // no mask: not what a client may send
  Decoder d(true, 1024);
  d.feed(wire.data(), wire.size());
  EXPECT_FALSE(d.next().has_value());
  ASSERT_TRUE(d.violation().has_value());
  EXPECT_EQ(d.violation()->close_code, kCloseProtocolError);
  // A dead stream stays dead.
  std::string good;
  encodeClientFrame(Opcode::kBinary, "x", &good);
  d.feed(good.data(), good.size());
  EXPECT_FALSE(d.next().has_value());
}

TEST(WebSocket, FragmentsJoinWithControlFramesBetween) {
  std::string wire = rawFrame(false, 1, "{\"type\":", kMask) + rawFrame(true, 9, "ping!", kMask) +
                     rawFrame(false, 0, "\"resize\",", kMask) + rawFrame(true, 0, "\"rows\":3}", kMask);
  Decoder d(true, 1024);
  d.feed(wire.data(), wire.size());
  auto ping = d.next();
  ASSERT_TRUE(ping.has_value());
  EXPECT_EQ(ping->op, Opcode::kPing);
  EXPECT_EQ(ping->payload, "ping!");
  auto text = d.next();
  ASSERT_TRUE(text.has_value());
  EXPECT_EQ(text->op, Opcode::kText);
  EXPECT_EQ(text->payload, "{\"type\":\"resize\",\"rows\":3}");
  EXPECT_FALSE(d.next().has_value());
}

TEST(WebSocket, CloseFramesCarryTheirCode) {
  std::string wire;
  encodeFrame(Opcode::kClose, closePayload(kCloseNormal, "exited"), &wire, kMask);
  Decoder d(true, 1024);
  d.feed(wire.data(), wire.size());
  auto m = d.next();
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->op, Opcode::kClose);
  ASSERT_GE(m->payload.size(), 2u);
  EXPECT_EQ((static_cast<uint8_t>(m->payload[0]) << 8) | static_cast<uint8_t>(m->payload[1]), kCloseNormal);
  EXPECT_EQ(m->payload.substr(2), "exited");
  EXPECT_LE(closePayload(kCloseNormal, std::string(500, 'r')).size(), 125u);
}

TEST(WebSocket, OversizeMessagesAreRefusedOnTheirHeader) {
  // Only the header of a 1 GiB frame arrives: refused at once, nothing buffered.
  std::string head = "\x82\xFF";
  const uint64_t n = uint64_t{1} << 30;
  for (int shift = 56; shift >= 0; shift -= 8) head.push_back(static_cast<char>((n >> shift) & 0xFF));
  head.append(reinterpret_cast<const char*>(kMask), 4);
  Decoder d(true, uint64_t{64} * 1024);
  d.feed(head.data(), head.size());
  EXPECT_FALSE(d.next().has_value());
  ASSERT_TRUE(d.violation().has_value());
  EXPECT_EQ(d.violation()->close_code, kCloseTooBig);

  // Fragments that are small one by one but too large together are refused too.
  Decoder f(true, 100);
  std::string wire = rawFrame(false, 2, std::string(60, 'a'), kMask) + rawFrame(true, 0, std::string(60, 'b'), kMask);
  f.feed(wire.data(), wire.size());
  EXPECT_FALSE(f.next().has_value());
  ASSERT_TRUE(f.violation().has_value());
  EXPECT_EQ(f.violation()->close_code, kCloseTooBig);
}

TEST(WebSocket, MalformedFramesAreProtocolErrors) {
  struct Case {
    const char* what;
    std::string wire;
  };
  std::string rsv = rawFrame(true, 2, "x", kMask);
  rsv[0] = static_cast<char>(rsv[0] | 0x40);
  const Case cases[] = {
      {"reserved bit", rsv},
      {"fragmented ping", rawFrame(false, 9, "x", kMask)},
      {"long ping", rawFrame(true, 9, std::string(126, 'p'), kMask)},
      {"stray continuation", rawFrame(true, 0, "x", kMask)},
      {"message inside a message", rawFrame(false, 2, "a", kMask) + rawFrame(true, 2, "b", kMask)},
      {"unknown opcode", rawFrame(true, 3, "x", kMask)},
  };
  for (const auto& c : cases) {
    Decoder d(true, 1024);
    d.feed(c.wire.data(), c.wire.size());
    EXPECT_FALSE(d.next().has_value()) << c.what;
    ASSERT_TRUE(d.violation().has_value()) << c.what;
    EXPECT_EQ(d.violation()->close_code, kCloseProtocolError) << c.what;
  }
}

}  // namespace
}  // namespace dsec::launcher::ws
