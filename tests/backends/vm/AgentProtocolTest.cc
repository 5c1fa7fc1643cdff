// The wire format (backends/vm/protocol/AgentProtocol.h): round trips, and what a hostile peer's bytes come to.
#include <gtest/gtest.h>

#include "AgentProtocol.h"

namespace dsec::vm::protocol {
namespace {

std::string header(uint32_t length, uint16_t type, uint16_t flags, uint32_t request) {
  std::string h(kHeaderBytes, '\0');
  putU32(h.data(), length);
  putU16(h.data() + 4, type);
  putU16(h.data() + 6, flags);
  putU32(h.data() + 8, request);
  return h;
}

TEST(AgentProtocolTest, FramesRoundTripAcrossArbitrarySplits) {
  ExecMsg exec;
  exec.argv = {"sh", "-c", std::string("echo \0 bin", 10)};
  exec.env = {{"A", "1"}, {"EMPTY", ""}};
  exec.cwd = "/work";
  exec.stdin_data = std::string(1000, 'z');
  exec.tty = true;
  exec.rows = 40;
  exec.cols = 120;
  exec.timeout_ms = 1500;
  exec.output_cap = int64_t{1} << 40;
  std::string stream = encodeFrame(FrameType::kExec, 7, exec.encode()) + encodeFrame(FrameType::kStdinEof, 7, "") +
                       encodeFrame(FrameType::kHello, 8, HelloMsg{-5}.encode());
  for (size_t step : {size_t{1}, size_t{3}, size_t{13}, stream.size()}) {
    FrameParser parser;
    std::vector<Frame> frames;
    for (size_t i = 0; i < stream.size(); i += step) {
      parser.append(stream.data() + i, std::min(step, stream.size() - i));
      Frame f;
      while (parser.next(&f) == FrameParser::Status::kFrame) frames.push_back(f);
    }
    ASSERT_EQ(frames.size(), 3u) << step;
    EXPECT_EQ(frames[0].type, FrameType::kExec);
    EXPECT_EQ(frames[0].request, 7u);
    ExecMsg back;
    ASSERT_TRUE(back.decode(frames[0].payload));
    EXPECT_EQ(back.argv, exec.argv);
    EXPECT_EQ(back.env, exec.env);
    EXPECT_EQ(back.cwd, "/work");
    EXPECT_EQ(back.stdin_data, exec.stdin_data);
    EXPECT_TRUE(back.tty);
    EXPECT_EQ(back.rows, 40u);
    EXPECT_EQ(back.timeout_ms, 1500);
    EXPECT_EQ(back.output_cap, int64_t{1} << 40);
    EXPECT_EQ(frames[1].type, FrameType::kStdinEof);
    HelloMsg hello;
    ASSERT_TRUE(hello.decode(frames[2].payload));
    EXPECT_EQ(hello.nonce, -5);
  }
}

TEST(AgentProtocolTest, MessagesRoundTrip) {
  ExitMsg exit{137, 9, true, true, 123456};
  ExitMsg e2;
  ASSERT_TRUE(e2.decode(exit.encode()));
  EXPECT_EQ(e2.exit_code, 137);
  EXPECT_EQ(e2.signal, 9);
  EXPECT_TRUE(e2.timed_out && e2.truncated);
  DirEntriesMsg dir;
  dir.entries.push_back(StatEntry{"a", EntryType::kDir, 4096, 0755, 1700000000});
  dir.entries.push_back(StatEntry{"b", EntryType::kSymlink, 3, 0777, 1});
  DirEntriesMsg d2;
  ASSERT_TRUE(d2.decode(dir.encode()));
  ASSERT_EQ(d2.entries.size(), 2u);
  EXPECT_EQ(d2.entries[1].name, "b");
  EXPECT_EQ(d2.entries[1].type, EntryType::kSymlink);
  SetupMsg setup{"h", 3, 1 << 20, 64, {{"K", "V"}}, "/sbin/init"};
  SetupMsg s2;
  ASSERT_TRUE(s2.decode(setup.encode()));
  EXPECT_EQ(s2.layer_disks, 3u);
  EXPECT_EQ(s2.env.at("K"), "V");
  EXPECT_EQ(s2.init, "/sbin/init");
  // The init the agent hands PID 1 to is an absolute path of bounded length.
  for (const std::string& bad : {std::string("sbin/init"), "/" + std::string(300, 'x')}) {
    SetupMsg relative{"h", 1, 0, 0, {}, bad};
    EXPECT_FALSE(SetupMsg().decode(relative.encode())) << bad;
  }
}

TEST(AgentProtocolTest, OversizeFramesAreRefusedBeforeTheirPayload) {
  FrameParser parser;
  std::string h = header(kMaxPayload + 1, static_cast<uint16_t>(FrameType::kStdout), 0, 1);
  parser.append(h.data(), h.size());  // no payload needed: the header alone is refused
  Frame f;
  EXPECT_EQ(parser.next(&f), FrameParser::Status::kError);
  EXPECT_EQ(parser.error(), HeaderError::kOversize);
  // Sticky: nothing after it is taken for a frame.
  std::string good = encodeFrame(FrameType::kOk, 1, "");
  parser.append(good.data(), good.size());
  EXPECT_EQ(parser.next(&f), FrameParser::Status::kError);
  // The largest allowed frame passes.
  FrameParser ok;
  std::string big = encodeFrame(FrameType::kStdout, 2, std::string(kMaxPayload, 'x'));
  ok.append(big.data(), big.size());
  ASSERT_EQ(ok.next(&f), FrameParser::Status::kFrame);
  EXPECT_EQ(f.payload.size(), kMaxPayload);
}

TEST(AgentProtocolTest, UnknownTypesAndFlagsAreRefused) {
  for (uint16_t type : {0, 19, 63, 74, 0xffff}) {
    FrameParser parser;
    std::string h = header(0, type, 0, 1);
    parser.append(h.data(), h.size());
    Frame f;
    EXPECT_EQ(parser.next(&f), FrameParser::Status::kError) << type;
    EXPECT_EQ(parser.error(), HeaderError::kBadType);
  }
  FrameParser parser;
  std::string h = header(0, static_cast<uint16_t>(FrameType::kOk), 1, 1);
  parser.append(h.data(), h.size());
  Frame f;
  EXPECT_EQ(parser.next(&f), FrameParser::Status::kError);
  EXPECT_EQ(parser.error(), HeaderError::kBadFlags);
}

TEST(AgentProtocolTest, TruncatedFramesWaitAndTruncatedMessagesFailToDecode) {
  std::string frame = encodeFrame(FrameType::kExit, 3, ExitMsg{1, 0, false, false, 5}.encode());
  FrameParser parser;
  parser.append(frame.data(), frame.size() - 1);
  Frame f;
  EXPECT_EQ(parser.next(&f), FrameParser::Status::kNeedMore);
  std::string payload = ExitMsg{1, 0, false, false, 5}.encode();
  ExitMsg e;
  for (size_t n = 0; n < payload.size(); ++n) EXPECT_FALSE(e.decode(payload.substr(0, n))) << n;
  EXPECT_FALSE(e.decode(payload + "x"));  // trailing bytes
  // A string or count longer than what is left.
  std::string lying = Writer().u32(1000).take() + "abc";
  PathMsg p;
  EXPECT_FALSE(p.decode(lying));
  std::string many = Writer().u32(0xffffffffu).take();
  ExecMsg x;
  EXPECT_FALSE(x.decode(many));
  DirEntriesMsg d;
  EXPECT_FALSE(d.decode(Writer().u32(kMaxItems).take()));
}

TEST(AgentProtocolTest, OutOfRangeFieldsFailToDecode) {
  ExitMsg e;
  EXPECT_FALSE(e.decode(ExitMsg{256, 0, false, false, 0}.encode()));
  EXPECT_FALSE(e.decode(ExitMsg{0, 65, false, false, 0}.encode()));
  EXPECT_FALSE(e.decode(ExitMsg{0, 0, false, false, -1}.encode()));
  ErrorMsg err;
  EXPECT_FALSE(err.decode(ErrorMsg{-1, "x"}.encode()));
  EXPECT_FALSE(err.decode(Writer().u32(2).str(std::string(kMaxErrorMessage + 1, 'm')).take()));
  UsageMsg u;
  EXPECT_FALSE(u.decode(UsageMsg{-1, 0}.encode()));
  StatEntry s;
  EXPECT_FALSE(s.decode(Writer().str("n").u8(9).i64(0).u32(0).i64(0).take()));
  ExecMsg x;
  x.argv = {};
  EXPECT_FALSE(ExecMsg().decode(x.encode()));  // no argv
  PathMsg p;
  p.path = std::string("a\0b", 3);
  EXPECT_FALSE(PathMsg().decode(p.encode()));
}

}  // namespace
}  // namespace dsec::vm::protocol
