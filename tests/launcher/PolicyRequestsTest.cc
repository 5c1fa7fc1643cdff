// The API edge of egress policies and protected paths: the create fields, the bodies of PUT .../network and
// .../protect, and the violations document. Every bad input is refused naming the field.
#include <gtest/gtest.h>

#include "dsec/launcher/api/PolicyRequests.h"
#include "dsec/launcher/api/Requests.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::launcher {
namespace {

using nlohmann::json;

Result<CreateParams> create(const std::string& body) {
  auto j = parseJsonObject(body);
  if (!j.ok()) return j.error();
  return parseCreateRequest(*j, 8LL << 30);
}

void expectInvalid(const Status& st, const std::string& mention) {
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code(), ErrorCode::kInvalidArgument) << st.error().toString();
  EXPECT_NE(st.error().message().find(mention), std::string::npos) << st.error().message();
}

template <typename T>
Status statusOf(const Result<T>& r) {
  return r.ok() ? okStatus() : Status(r.error());
}

TEST(PolicyRequests, CreateWithAnEgressPolicyGetsALinkAndTheNormalisedRules) {
  auto r = create(R"({"image": "a:1", "network": {"egress": ["10.0.0.0/8", "192.0.2.1:443", "PyPI.org:443",
                     "*.pythonhosted.org", "10.0.0.0/8"]}})");
  ASSERT_OK(r);
  EXPECT_EQ(r->network, backends::NetworkMode::kEgress);
  EXPECT_EQ(r->egress.texts(),
            (std::vector<std::string>{"10.0.0.0/8", "192.0.2.1:443", "pypi.org:443", "*.pythonhosted.org"}));
  ASSERT_EQ(r->egress.rules.size(), 4u);
  EXPECT_EQ(r->egress.rules[1].prefix_len, 32);
  EXPECT_EQ(r->egress.rules[1].port, 443);
  EXPECT_TRUE(r->egress.rules[3].wildcard);
}

TEST(PolicyRequests, AnEmptyPolicyIsALinkWithNoEgressAndTheOldStringMeansAnywhere) {
  auto empty = create(R"({"image": "a:1", "network": {"egress": []}})");
  ASSERT_OK(empty);
  EXPECT_EQ(empty->network, backends::NetworkMode::kEgress);
  EXPECT_TRUE(empty->egress.rules.empty());
  auto old = create(R"({"image": "a:1", "network": "egress"})");
  ASSERT_OK(old);
  EXPECT_EQ(old->egress.texts(), std::vector<std::string>{"0.0.0.0/0"});
  auto none = create(R"({"image": "a:1"})");
  ASSERT_OK(none);
  EXPECT_EQ(none->network, backends::NetworkMode::kNone);
  EXPECT_TRUE(none->egress.rules.empty());
}

TEST(PolicyRequests, BadEgressEntriesAreRefusedNamingThem) {
  expectInvalid(statusOf(create(R"({"image": "a:1", "network": {"egress": ["10.0.0.1/8"]}})")), "host bits");
  expectInvalid(statusOf(create(R"({"image": "a:1", "network": {"egress": ["[2001:db8::1]:443"]}})")), "IPv6");
  expectInvalid(statusOf(create(R"({"image": "a:1", "network": {"egress": ["10.0.0.0/33"]}})")), "prefix");
  expectInvalid(statusOf(create(R"({"image": "a:1", "network": {"egress": ["a.b:0"]}})")), "port");
  expectInvalid(statusOf(create(R"({"image": "a:1", "network": {"egress": ["a.b:70000"]}})")), "port");
  expectInvalid(statusOf(create(R"({"image": "a:1", "network": {"egress": ["bad_-.name"]}})")), "domain");
  expectInvalid(statusOf(create(R"({"image": "a:1", "network": {"egress": ["*.com"]}})")), "wildcard");
  expectInvalid(statusOf(create(R"({"image": "a:1", "network": {"egress": [""]}})")), "empty");
  expectInvalid(statusOf(create(R"({"image": "a:1", "network": {"egress": "10.0.0.0/8"}})")), "array");
  expectInvalid(statusOf(create(R"({"image": "a:1", "network": {"egress": [1]}})")), "array of strings");
  expectInvalid(statusOf(create(R"({"image": "a:1", "network": {"egres": []}})")), "egres");
  expectInvalid(statusOf(create(R"({"image": "a:1", "network": {}})")), "egress");
  json many = json::array();
  for (int i = 0; i < 300; ++i) many.push_back("10.0." + std::to_string(i / 256) + "." + std::to_string(i % 256));
  expectInvalid(statusOf(parseNetworkBody(json{{"egress", many}})), "at most 256");
}

TEST(PolicyRequests, ProtectedPathsAreNormalisedAndBadOnesRefused) {
  auto r = create(R"({"image": "a:1", "protect": ["/usr/", "/workspace//tests", "/usr", "/a/./b"]})");
  ASSERT_OK(r);
  EXPECT_EQ(r->protected_paths, (std::vector<std::string>{"/a/b", "/usr", "/workspace/tests"}));
  expectInvalid(statusOf(create(R"({"image": "a:1", "protect": ["relative"]})")), "absolute");
  expectInvalid(statusOf(create(R"({"image": "a:1", "protect": ["/a/../etc"]})")), "..");
  expectInvalid(statusOf(create(R"({"image": "a:1", "protect": ["/"]})")), "read-only root");
  expectInvalid(statusOf(create(R"({"image": "a:1", "protect": "/usr"})")), "protect");
  auto body = parseProtectBody(json{{"paths", {"/x"}}});
  ASSERT_OK(body);
  EXPECT_EQ(*body, std::vector<std::string>{"/x"});
  expectInvalid(statusOf(parseProtectBody(json{{"path", {"/x"}}})), "path");
  expectInvalid(statusOf(parseProtectBody(json::object())), "paths");
}

TEST(PolicyRequests, TheViolationsDocumentListsEachWithItsKind) {
  backends::Violation dns;
  dns.time_unix = 1795000000.5;
  dns.kind = backends::ViolationKind::kDns;
  dns.target = "evil.example";
  dns.detail = "name not in the egress policy";
  backends::Violation file = dns;
  file.kind = backends::ViolationKind::kFile;
  file.target = "/workspace/tests/t.py";
  json doc = violationsJson({dns, file});
  EXPECT_EQ(doc["count"], 2);
  EXPECT_EQ(doc["violations"][0]["kind"], "dns");
  EXPECT_EQ(doc["violations"][0]["target"], "evil.example");
  EXPECT_EQ(doc["violations"][0]["time"], 1795000000.5);
  EXPECT_EQ(doc["violations"][1]["kind"], "file");
  EXPECT_EQ(violationsJson({})["violations"], json::array());
}

}  // namespace
}  // namespace dsec::launcher
