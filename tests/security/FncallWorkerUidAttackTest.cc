// Attack: a call uses up a per-user kernel limit (inotify instances, counted per uid up the user namespace
// tree) while a call on another worker runs. Were calls of different workers the same host uid (as they
// were: uid 65534 everywhere), the second call would find the limit used up, and the first could also
// signal or ptrace the other's processes through any shared namespace. Each worker is a sandbox with its own
// user namespace and host id range, so its calls' host uid is one no other worker (or sandbox) has.
#include <gtest/gtest.h>

#include <future>
#include <set>
#include <sstream>

#include "FncallNodeFixture.h"

namespace dsec::testing {
namespace {

using nlohmann::json;

// Prints the worker, the call's host uid base (uid_map) and then whether it holds its inotify instances.
constexpr const char* kWhoAmI =
    "import os, socket\n"
    "inside, outside, count = open('/proc/self/uid_map').read().split()[:3]\n"
    "print(socket.gethostname(), inside, outside, count, os.getuid())\n";

constexpr const char* kHog =
    "import ctypes, time\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "fds = []\n"
    "while len(fds) < 100000:\n"
    "    fd = libc.inotify_init1(0)\n"
    "    if fd < 0: break\n"
    "    fds.append(fd)\n"
    "print('held', len(fds), 'errno', ctypes.get_errno(), 'from', time.time(), flush=True)\n"
    "time.sleep(20)\n"
    "print('until', time.time())\n";

constexpr const char* kVictim =
    "import ctypes, time\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "fd = libc.inotify_init1(0)\n"
    "print('victim', fd, 'errno', ctypes.get_errno(), 'at', time.time())\n";

struct Identity {
  std::string worker;
  std::string inside, outside, count, uid;
};

Identity identify(const json& r) {
  std::istringstream in(r.value("stdout", ""));
  Identity id;
  in >> id.worker >> id.inside >> id.outside >> id.count >> id.uid;
  return id;
}

json callOn(HttpTestClient& client, const json& body) {
  HttpReply r = client.postJson("/v1/call", body);
  EXPECT_EQ(r.status, 200) << r.body;
  return r.status == 200 ? r.json() : json::object();
}

// The number after `key` in a line of output; -1 when absent.
double numberAfter(const std::string& text, const std::string& key) {
  size_t at = text.find(key + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + key.size() + 1));
}

TEST_F(FncallNodeAttack, CallsOfDifferentWorkersAreDifferentHostUsers) {
  auto o = options();
  o.node.fncall.max_workers = 2;
  start(o);
  if (IsSkipped() || HasFatalFailure()) return;
  // A second client: one client's requests go one after another on its connection.
  auto other = std::make_unique<HttpTestClient>(node_->endpoint(), node_->token());
  // Two calls at once run on two workers (once both workers exist: until then a call may wait for the
  // first worker to come free instead of the second to start).
  const std::string slow = "import time\ntime.sleep(3)\n" + std::string(kWhoAmI);
  Identity first, second;
  for (int attempt = 0; attempt < 4 && (first.worker.empty() || first.worker == second.worker); ++attempt) {
    auto a = std::async(std::launch::async, [&] { return callOn(*other, {{"code", slow}, {"timeout", 120}}); });
    second = identify(call({{"code", slow}, {"timeout", 120}}));
    first = identify(a.get());
  }
  ASSERT_FALSE(first.worker.empty());
  ASSERT_NE(first.worker, second.worker) << "two calls at once must run on two workers";
  for (const Identity* id : {&first, &second}) {
    EXPECT_EQ(id->inside, "0") << "the call must see a user namespace of its own";
    EXPECT_EQ(id->count, "65536");
    EXPECT_NE(id->outside, "0") << "sandbox root is host root";
    EXPECT_EQ(id->uid, "65534");
  }
  EXPECT_NE(first.outside, second.outside) << "two workers' calls share host uid range " << first.outside;

  // A call on one worker takes every inotify instance its user may have; a call on the other still gets one.
  bool overlapped = false;
  for (int attempt = 0; attempt < 3 && !overlapped; ++attempt) {
    auto hog = std::async(std::launch::async, [&] { return callOn(*other, {{"code", kHog}, {"timeout", 120}}); });
    // The victim must run while the hog holds: the times both print are checked below (and retried if not).
    std::this_thread::sleep_for(std::chrono::milliseconds(4000));
    json victim = call({{"code", kVictim}, {"timeout", 120}});
    json held = hog.get();
    const std::string hog_out = held.value("stdout", "");
    const std::string victim_out = victim.value("stdout", "");
    ASSERT_GT(numberAfter(hog_out, "held"), 0) << held.dump();
    const double from = numberAfter(hog_out, "from"), until = numberAfter(hog_out, "until");
    const double at = numberAfter(victim_out, "at");
    if (from < 0 || until < 0 || at < from || at > until) continue;  // not at the same time: try again
    overlapped = true;
    EXPECT_GE(numberAfter(victim_out, "victim"), 0)
        << "a call on another worker lost its inotify instances to this one: " << victim_out << " / " << hog_out;
  }
  EXPECT_TRUE(overlapped) << "the two calls never ran at the same time";
}

}  // namespace
}  // namespace dsec::testing
