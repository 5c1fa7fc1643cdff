// A guest is hostile, its agent included: whatever it sends, the node's side of the agent protocol
// (AgentChannel) fails the request cleanly (an error, no crash, no unbounded memory) and quickly (the request's
// deadline plus a small margin), and goes on serving with the ports that still behave.
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <thread>

#include "AgentProtocol.h"
#include "dsec/backends/vm/AgentChannel.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::testing {
namespace {

namespace proto = dsec::vm::protocol;
using backends::ExecRequest;
using backends::vm::AgentChannel;
using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

void sendRaw(int fd, const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

// The guest's end of one port. Hellos are answered (unless told not to); every other request goes to `misbehave`.
class FakeGuest {
 public:
  using Behaviour = std::function<void(int fd, const proto::Frame& request)>;
  FakeGuest(
      int fd, Behaviour misbehave, std::function<bool()> answer_hello = [] { return true; })
      : fd_(fd), misbehave_(std::move(misbehave)), answer_hello_(std::move(answer_hello)) {
    thread_ = std::thread([this] { run(); });
  }
  ~FakeGuest() {
    stop_ = true;
    shutdown(fd_, SHUT_RDWR);
    thread_.join();
    close(fd_);
  }
  std::atomic<int> requests{0};

 private:
  void run() {
    proto::FrameParser parser;
    char buf[65536];
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) continue;
      ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) return;
      parser.append(buf, static_cast<size_t>(n));
      proto::Frame f;
      while (parser.next(&f) == proto::FrameParser::Status::kFrame) {
        if (f.type == proto::FrameType::kHello) {
          if (answer_hello_()) sendRaw(fd_, proto::encodeFrame(proto::FrameType::kHelloOk, f.request, f.payload));
          continue;
        }
        if (f.type == proto::FrameType::kExec || f.type == proto::FrameType::kUsage ||
            f.type == proto::FrameType::kStat || f.type == proto::FrameType::kListDir ||
            f.type == proto::FrameType::kReadFile || f.type == proto::FrameType::kSetup) {
          ++requests;
          misbehave_(fd_, f);
        }
      }
    }
  }
  int fd_;
  Behaviour misbehave_;
  std::function<bool()> answer_hello_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

struct Rig {
  std::vector<std::unique_ptr<FakeGuest>> guests;
  std::unique_ptr<AgentChannel> channel;
};

// A channel over `behaviours.size()` ports, each with its fake guest.
Rig makeRig(const std::vector<FakeGuest::Behaviour>& behaviours, double connect_timeout = 5) {
  Rig rig;
  std::vector<UniqueFd> host_ends;
  for (const auto& b : behaviours) {
    int sv[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    host_ends.emplace_back(sv[0]);
    rig.guests.push_back(std::make_unique<FakeGuest>(sv[1], b));
  }
  auto channel = AgentChannel::connect(std::move(host_ends), connect_timeout);
  EXPECT_TRUE(channel.ok()) << channel.error().toString();
  if (channel.ok()) rig.channel = std::move(channel).value();
  return rig;
}

ExecRequest echoRequest(double timeout) {
  ExecRequest r;
  r.argv = {"echo", "hi"};
  r.timeout_seconds = timeout;
  return r;
}

const FakeGuest::Behaviour kSilent = [](int, const proto::Frame&) {};
const FakeGuest::Behaviour kHonestUsage = [](int fd, const proto::Frame& f) {
  sendRaw(fd, proto::encodeFrame(proto::FrameType::kUsageReply, f.request, proto::UsageMsg{1, 2}.encode()));
};

TEST(VmHostileAgentTest, AGuestThatNeverAnswersHelloFailsConnectAtItsTimeout) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  FakeGuest mute(sv[1], kSilent, [] { return false; });
  std::vector<UniqueFd> ports;
  ports.emplace_back(sv[0]);
  auto t0 = Clock::now();
  auto channel = AgentChannel::connect(std::move(ports), 1.0);
  ASSERT_FALSE(channel.ok());
  EXPECT_EQ(channel.error().code(), ErrorCode::kTimeout);
  EXPECT_NE(channel.error().message().find("dsec.0"), std::string::npos) << channel.error().message();
  EXPECT_LT(secondsSince(t0), 3);
}

TEST(VmHostileAgentTest, OversizeFramesGarbageAndBadTypesFailTheRequestAtOnce) {
  const std::vector<std::pair<const char*, std::string>> attacks = {
      {"oversize",
       [] {
         std::string h(proto::kHeaderBytes, '\0');
         proto::putU32(h.data(), 0xffffffffu);  // 4 GiB: refused before a byte of it is read
         proto::putU16(h.data() + 4, static_cast<uint16_t>(proto::FrameType::kStdout));
         return h;
       }()},
      {"garbage", std::string(4096, '\xa5')},
      {"bad type",
       [] {
         std::string f = proto::encodeFrame(proto::FrameType::kOk, 1, "");
         proto::putU16(f.data() + 4, 999);
         return f;
       }()},
  };
  for (const auto& [name, bytes] : attacks) {
    Rig rig = makeRig({[bytes = bytes](int fd, const proto::Frame&) { sendRaw(fd, bytes); }});
    ASSERT_TRUE(rig.channel) << name;
    auto t0 = Clock::now();
    auto r = rig.channel->exec(echoRequest(60), nullptr);
    ASSERT_FALSE(r.ok()) << name;
    EXPECT_EQ(r.error().code(), ErrorCode::kUnavailable) << name << ": " << r.error().toString();
    EXPECT_LT(secondsSince(t0), 2) << name;
  }
}

TEST(VmHostileAgentTest, AnAnswerForAnotherRequestIsNotTakenForTheAnswer) {
  Rig rig = makeRig({[](int fd, const proto::Frame& f) {
    sendRaw(fd, proto::encodeFrame(proto::FrameType::kUsageReply, f.request + 1, proto::UsageMsg{1, 2}.encode()));
  }});
  auto r = rig.channel->usage();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kUnavailable);
  // A reply of the wrong kind for this request is refused as well.
  Rig other = makeRig({[](int fd, const proto::Frame& f) {
    sendRaw(fd, proto::encodeFrame(proto::FrameType::kStatReply, f.request, proto::StatEntry{"x"}.encode()));
  }});
  ASSERT_FALSE(other.channel->usage().ok());
}

TEST(VmHostileAgentTest, ASilentGuestFailsAnExecAtItsTimeoutPlusTheMargin) {
  Rig rig = makeRig({kSilent});
  auto t0 = Clock::now();
  auto r = rig.channel->exec(echoRequest(1), nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kTimeout);
  double took = secondsSince(t0);
  EXPECT_GE(took, 1);
  EXPECT_LT(took, 1 + 10 + 3);  // kExecMarginSeconds
}

TEST(VmHostileAgentTest, OutputPastTheCapIsDroppedOnTheNodeWhateverTheGuestSays) {
  Rig rig = makeRig({[](int fd, const proto::Frame& f) {
    sendRaw(fd, proto::encodeFrame(proto::FrameType::kStarted, f.request, ""));
    std::string chunk(proto::kMaxChunk, 'o');
    for (int i = 0; i < 64; ++i) sendRaw(fd, proto::encodeFrame(proto::FrameType::kStdout, f.request, chunk));
    // It claims nothing was truncated.
    sendRaw(fd, proto::encodeFrame(proto::FrameType::kExit, f.request, proto::ExitMsg{0, 0, false, false, 1}.encode()));
  }});
  ExecRequest req = echoRequest(30);
  req.output_cap = 1000;
  auto r = rig.channel->exec(req, nullptr);
  ASSERT_OK(r);
  EXPECT_EQ(r->stdout_data.size(), 1000u);
  EXPECT_TRUE(r->truncated);
}

TEST(VmHostileAgentTest, MalformedMessagesInWellFormedFramesAreRefused) {
  Rig rig = makeRig({[](int fd, const proto::Frame& f) {
    if (f.type == proto::FrameType::kExec) {
      sendRaw(fd, proto::encodeFrame(proto::FrameType::kStarted, f.request, ""));
      sendRaw(fd, proto::encodeFrame(proto::FrameType::kExit, f.request, "short"));
    } else if (f.type == proto::FrameType::kStat) {
      // An errno far out of range, and a message with control characters.
      sendRaw(fd, proto::encodeFrame(proto::FrameType::kError, f.request, proto::Writer().u32(99999).str("x").take()));
    } else if (f.type == proto::FrameType::kListDir) {
      proto::DirEntriesMsg m;
      m.entries.push_back(proto::StatEntry{"../../etc", proto::EntryType::kFile, 1, 0644, 0});
      sendRaw(fd, proto::encodeFrame(proto::FrameType::kDirEntries, f.request, m.encode()));
      sendRaw(fd, proto::encodeFrame(proto::FrameType::kOk, f.request, ""));
    } else if (f.type == proto::FrameType::kUsage) {
      sendRaw(fd, proto::encodeFrame(proto::FrameType::kError, f.request,
                                     proto::ErrorMsg{2, "no\x1b[2Jsuch\nfile"}.encode()));
    }
  }});
  EXPECT_FALSE(rig.channel->exec(echoRequest(30), nullptr).ok());
  auto st = rig.channel->stat("/x");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code(), ErrorCode::kUnavailable);
  auto list = rig.channel->listDir("/");
  ASSERT_FALSE(list.ok());  // a name with a slash is not an entry of the directory
  EXPECT_EQ(list.error().code(), ErrorCode::kUnavailable);
  auto usage = rig.channel->usage();
  ASSERT_FALSE(usage.ok());
  EXPECT_EQ(usage.error().code(), ErrorCode::kNotFound);
  for (char c : usage.error().message()) EXPECT_TRUE(c >= 0x20 && c < 0x7f) << usage.error().message();
}

TEST(VmHostileAgentTest, ADirtyPortThatNoLongerSaysHelloIsDroppedAndTheOthersServe) {
  // Port 0 answers its first request with a frame that is no answer (the port is then dirty) and never answers
  // hello again; port 1 answers usage honestly and never answers an exec.
  int sv0[2], sv1[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv0), 0);
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv1), 0);
  std::vector<UniqueFd> ports;
  ports.emplace_back(sv0[0]);
  ports.emplace_back(sv1[0]);
  FakeGuest* bad_ptr = nullptr;
  auto bad = std::make_unique<FakeGuest>(
      sv0[1],
      [](int fd, const proto::Frame& f) {
        sendRaw(fd, proto::encodeFrame(proto::FrameType::kStdout, f.request, "not an answer to usage"));
      },
      [&bad_ptr] { return bad_ptr == nullptr || bad_ptr->requests == 0; });
  bad_ptr = bad.get();
  auto good = std::make_unique<FakeGuest>(sv1[1], kHonestUsage);
  auto channel = AgentChannel::connect(std::move(ports), 5);
  ASSERT_OK(channel);
  // Both ports are free: the first request takes port 0 and fails; the next ones prefer clean port 1.
  EXPECT_FALSE((*channel)->usage().ok());
  for (int i = 0; i < 3; ++i) {
    auto u = (*channel)->usage();
    ASSERT_OK(u);
    EXPECT_EQ(u->pids, 2);
  }
  // With port 1 busy (an exec its guest never answers), a request must take port 0: hello goes unanswered, the
  // port is given up, and the request waits for port 1.
  std::thread busy([&] { EXPECT_FALSE((*channel)->exec(echoRequest(1), nullptr).ok()); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  auto t0 = Clock::now();
  auto u = (*channel)->usage();
  busy.join();
  ASSERT_OK(u);
  EXPECT_LT(secondsSince(t0), 20);
  for (int i = 0; i < 3; ++i) ASSERT_OK((*channel)->usage());
  EXPECT_EQ(bad->requests, 1);
}

TEST(VmHostileAgentTest, CloseFailsEveryRequestInFlightAtOnce) {
  Rig rig = makeRig({kSilent, kSilent});
  std::vector<std::thread> waiters;
  std::atomic<int> unavailable{0};
  for (int i = 0; i < 3; ++i) {  // two on the ports, one waiting for a port
    waiters.emplace_back([&] {
      auto r = rig.channel->exec(echoRequest(600), nullptr);
      if (!r.ok() && r.error().code() == ErrorCode::kUnavailable) ++unavailable;
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto t0 = Clock::now();
  rig.channel->close();
  for (auto& t : waiters) t.join();
  EXPECT_LT(secondsSince(t0), 2);
  EXPECT_EQ(unavailable, 3);
  ASSERT_ERROR(rig.channel->usage(), ErrorCode::kUnavailable);
}

}  // namespace
}  // namespace dsec::testing
