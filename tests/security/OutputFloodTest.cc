// Code inside sandboxes floods the node with exec output: many execs at once print their whole output cap
// in NUL bytes (each escapes to six bytes of JSON) and then hold on to it. The node must stay within its output
// budget (its RSS grows by at most the budget plus a margin), answer the execs over the budget with 429
// capacity and retry_after, and still serve a legitimate exec meanwhile. A real node with real container
// sandboxes; skipped (with the reason) without root or a usable container backend.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include "ApiFixture.h"
#include "dsec/common/Strings.h"

namespace dsec::testing {
namespace {

using nlohmann::json;
namespace http = boost::beast::http;

constexpr uint64_t kBudget = uint64_t{64} << 20;
constexpr int64_t kCap = int64_t{16} << 20;  // the default output cap, per stream
// What else the node and this test's clients may grow by during the flood: threads, pipes' read buffers, the
// escaping slices of the answers being written, allocator slack.
constexpr int64_t kMargin = int64_t{96} << 20;

struct FloodAnswer {
  int status = 0;
  std::string error_body;  // non-200
  std::map<std::string, std::string> headers;
  uint64_t bytes = 0;
  std::string head, tail;  // first and last bytes of a 200 body
  std::string failure;     // the request itself failed
};

json budgetOf(HttpTestClient& client) { return client.get("/v1/node").json().value("output_budget", json::object()); }

class OutputFloodTest : public ApiTest {
 protected:
  bool startWithBudget() {
    auto o = options();
    o.output_budget_bytes = kBudget;
    return startNode(o);
  }
};

TEST_F(OutputFloodTest, ManySandboxesPrintingTheirCapInNulBytesStayWithinTheBudget) {
  ASSERT_TRUE(startWithBudget());
  SKIP_WITHOUT_BACKEND();
  constexpr int kSandboxes = 4;
  constexpr int kFloods = 16;
  std::vector<std::string> ids;
  for (int i = 0; i < kSandboxes; ++i) {
    ids.push_back(createSandbox());
    ASSERT_FALSE(ids.back().empty());
  }
  // Each flood prints its cap on stdout and on stderr, then keeps it held (sleeps) until the test releases it.
  const std::string flood =
      "head -c " + std::to_string(kCap) + " /dev/zero; head -c " + std::to_string(kCap) +
      " /dev/zero >&2; i=0; while [ ! -e /tmp/release ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i+1)); done";

  resetPeakRss();
  const int64_t baseline = residentBytes();
  std::vector<FloodAnswer> answers(kFloods);
  std::vector<std::thread> threads;
  for (int i = 0; i < kFloods; ++i) {
    threads.emplace_back([&, i] {
      FloodAnswer& a = answers[i];
      HttpTestClient c(node_->endpoint(), node_->token());
      try {
        auto r = c.postJsonStreamed(sandboxPath(ids[i % kSandboxes], "/exec"),
                                    json{{"cmd", flood}, {"output_cap", kCap}, {"timeout", 600}},
                                    [&](const char* data, size_t n) {
                                      if (a.head.size() < 64) a.head.append(data, std::min<size_t>(n, 64));
                                      a.tail.append(data, n);
                                      if (a.tail.size() > 64) a.tail.erase(0, a.tail.size() - 64);
                                      a.bytes += n;
                                    });
        a.status = r.status;
        a.error_body = r.body;
        a.headers = r.headers;
      } catch (const std::exception& e) {
        a.failure = e.what();
      }
    });
  }

  // The floods exhaust the budget (16 x 2 x 16 MiB against 64 MiB); the budget is never exceeded meanwhile.
  HttpTestClient watcher(node_->endpoint(), node_->token());
  bool exhausted = false;
  const double deadline = monotonicSeconds() + 300;
  while (!exhausted && monotonicSeconds() < deadline) {
    json b = budgetOf(watcher);
    ASSERT_EQ(b.value("capacity_bytes", uint64_t{0}), kBudget) << b.dump();
    EXPECT_LE(b.value("used_bytes", uint64_t{0}), kBudget) << b.dump();
    exhausted = b.value("evictions", 0) + b.value("refusals", 0) > 0;
    if (!exhausted) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(exhausted) << "the floods never exhausted the output budget: " << budgetOf(watcher).dump();

  // A legitimate exec while the floods hold the budget, and one whose small output needs escaping.
  double t0 = monotonicSeconds();
  auto legit = exec(ids[0], {{"cmd", "echo legit"}});
  EXPECT_EQ(legit.status, 200) << legit.body;
  EXPECT_EQ(legit.json().value("stdout", ""), "legit\n");
  EXPECT_LT(monotonicSeconds() - t0, 60.0);
  auto escaped = exec(ids[1], {{"cmd", "printf '\\000\\001\\377abc\\n'"}});
  ASSERT_EQ(escaped.status, 200) << escaped.body;
  EXPECT_EQ(escaped.json()["stdout"].get<std::string>(), std::string("\0\x01\xEF\xBF\xBD"
                                                                     "abc\n",
                                                                     9));

  for (const auto& id : ids) {
    auto r = client_->request(http::verb::put, sandboxPath(id, "/files?path=/tmp/release"), "go");
    EXPECT_EQ(r.status, 200) << r.body;
  }
  for (auto& t : threads) t.join();
  const int64_t growth = peakResidentBytes() - baseline;

  int served = 0, refused = 0;
  for (int i = 0; i < kFloods; ++i) {
    const FloodAnswer& a = answers[i];
    SCOPED_TRACE("flood " + std::to_string(i));
    ASSERT_TRUE(a.failure.empty()) << a.failure;
    if (a.status == 200) {
      // The whole output, escaped: two streams of 16 MiB of "\u0000", and the length it announced.
      ++served;
      EXPECT_EQ(a.headers.at("content-length"), std::to_string(a.bytes));
      EXPECT_GE(a.bytes, uint64_t{2} * kCap * 6);
      EXPECT_EQ(a.head.rfind("{\"duration\":", 0), 0u) << a.head;
      EXPECT_NE(a.tail.find("\"truncated\":false}\n"), std::string::npos) << a.tail;
      continue;
    }
    // The documented answer over the budget: 429 capacity, retry_after, naming the output budget.
    ASSERT_EQ(a.status, 429) << a.error_body;
    ++refused;
    json body = json::parse(a.error_body, nullptr, false);
    ASSERT_TRUE(body.is_object()) << a.error_body;
    EXPECT_EQ(body["error"]["code"], "capacity");
    EXPECT_EQ(body["error"]["resource"], "output_budget");
    EXPECT_GE(body["error"].value("retry_after", 0), 1);
    EXPECT_EQ(a.headers.count("retry-after"), 1u);
  }
  EXPECT_GT(refused, 0);
  EXPECT_EQ(served + refused, kFloods);
  EXPECT_LE(growth, static_cast<int64_t>(kBudget) + kMargin)
      << "the node grew by " << growth / (1 << 20) << " MiB for a budget of " << kBudget / (1 << 20) << " MiB";
  json b = budgetOf(watcher);
  EXPECT_EQ(b.value("used_bytes", uint64_t{1}), 0u) << b.dump();
  EXPECT_LE(b.value("peak_bytes", kBudget + 1), kBudget) << b.dump();
  RecordProperty("rss_growth_mib", static_cast<int>(growth >> 20));
  RecordProperty("served", served);
  RecordProperty("refused", refused);
}

TEST_F(OutputFloodTest, OutputLargerThanTheWholeBudgetIsRefusedAsTooLarge) {
  ASSERT_TRUE(startWithBudget());
  SKIP_WITHOUT_BACKEND();
  std::string id = createSandbox();
  ASSERT_FALSE(id.empty());
  resetPeakRss();
  const int64_t baseline = residentBytes();
  // 48 MiB on each stream with a cap that allows it: 96 MiB can never fit a 64 MiB budget.
  auto r = exec(
      id, {{"cmd", "head -c 50331648 /dev/zero; head -c 50331648 /dev/zero >&2"}, {"output_cap", int64_t{64} << 20}});
  ASSERT_EQ(r.status, 413) << r.body.substr(0, 300);
  EXPECT_EQ(r.errorCode(), "too_large");
  EXPECT_NE(r.body.find("exec/stream"), std::string::npos) << r.body;
  EXPECT_LE(peakResidentBytes() - baseline, static_cast<int64_t>(kBudget) + kMargin);
  // The same output streamed is fine: it is never held.
  uint64_t streamed = 0;
  auto s = client_->postJsonStreamed(sandboxPath(id, "/exec/stream"),
                                     json{{"cmd", "head -c 50331648 /dev/zero"}, {"output_cap", int64_t{64} << 20}},
                                     [&](const char*, size_t n) { streamed += n; });
  EXPECT_EQ(s.status, 200);
  EXPECT_GE(streamed, uint64_t{50331648} * 6);
  EXPECT_LE(peakResidentBytes() - baseline, static_cast<int64_t>(kBudget) + kMargin);
}

}  // namespace
}  // namespace dsec::testing
