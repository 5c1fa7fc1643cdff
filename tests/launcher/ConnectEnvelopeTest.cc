// The Connect protocol's envelopes (ConnectEnvelope.h), as E2B's SDK frames a streamed call.
#include <gtest/gtest.h>

#include "dsec/launcher/api/ConnectEnvelope.h"

namespace dsec::launcher {
namespace {

TEST(ConnectEnvelope, FramesRoundTripWithBigEndianLengths) {
  const std::string a = connectFrame(0, R"({"event":{"start":{"pid":7}}})");
  ASSERT_EQ(a.size(), 5 + 29u);
  EXPECT_EQ(a[0], '\0');
  EXPECT_EQ(static_cast<unsigned char>(a[4]), 29u);
  const std::string big(70000, 'x');
  const std::string b = connectFrame(kConnectEndStream, big);
  EXPECT_EQ(static_cast<unsigned char>(b[2]), 0x01u);  // 70000 = 0x00011170
  EXPECT_EQ(static_cast<unsigned char>(b[3]), 0x11u);
  auto parsed = parseConnectFrames(a + b);
  ASSERT_TRUE(parsed.ok()) << parsed.error().message();
  ASSERT_EQ(parsed->size(), 2u);
  EXPECT_EQ((*parsed)[0].json, R"({"event":{"start":{"pid":7}}})");
  EXPECT_EQ((*parsed)[1].flags, kConnectEndStream);
  EXPECT_EQ((*parsed)[1].json, big);
  EXPECT_TRUE(parseConnectFrames("")->empty());
}

TEST(ConnectEnvelope, CutShortCompressedOrOversizedMessagesAreRefused) {
  const std::string frame = connectFrame(0, "{}");
  EXPECT_FALSE(parseConnectFrames(frame.substr(0, 3)).ok());
  EXPECT_FALSE(parseConnectFrames(frame.substr(0, frame.size() - 1)).ok());
  std::string compressed = frame;
  compressed[0] = static_cast<char>(kConnectCompressed);
  EXPECT_FALSE(parseConnectFrames(compressed).ok());
  EXPECT_FALSE(parseConnectFrames(connectFrame(0, std::string(100, 'x')), 99).ok());
  // A length that claims more than 4 GiB of body is refused without reading past the end.
  EXPECT_FALSE(parseConnectFrames(std::string("\0\xff\xff\xff\xff", 5)).ok());
}

}  // namespace
}  // namespace dsec::launcher
