#include <gtest/gtest.h>

#include "dsec/common/Endpoint.h"
#include "dsec/testing/TestSupport.h"

namespace dsec {
namespace {

TEST(EndpointParse, AcceptsTheThreeForms) {
  auto a = parseEndpoint("10.0.0.1:8470");
  ASSERT_OK(a);
  EXPECT_EQ(a->host, "10.0.0.1");
  EXPECT_EQ(a->port, 8470);
  auto b = parseEndpoint("http://node-1.cluster:80/");
  ASSERT_OK(b);
  EXPECT_EQ(b->host, "node-1.cluster");
  EXPECT_EQ(b->port, 80);
  auto c = parseEndpoint("http://[::1]:8470/v1/node");
  ASSERT_OK(c);
  EXPECT_EQ(c->host, "::1");
  EXPECT_EQ(c->port, 8470);
  EXPECT_EQ(c->hostPort(), "[::1]:8470");
  auto d = parseEndpoint("[fe80::1]:1");
  ASSERT_OK(d);
  EXPECT_EQ(d->host, "fe80::1");
  EXPECT_EQ(d->port, 1);
  EXPECT_EQ(a->hostPort(), "10.0.0.1:8470");
}

TEST(EndpointParse, DefaultPortOnlyWhenAsked) {
  ASSERT_ERROR(parseEndpoint("http://127.0.0.1"), ErrorCode::kInvalidArgument);
  auto a = parseEndpoint("http://127.0.0.1", 80);
  ASSERT_OK(a);
  EXPECT_EQ(a->port, 80);
  auto b = parseEndpoint("[::1]", 8470);
  ASSERT_OK(b);
  EXPECT_EQ(b->host, "::1");
  EXPECT_EQ(b->port, 8470);
}

TEST(EndpointParse, RefusesBadInputsClearly) {
  for (const char* bad : {"",          "http://",     ":8470",        "http://:8470",   "host:",
                          "host:port", "host:-1",     "host:0",       "host:65536",     "host:123456",
                          "[::1",      "[::1]8470",   "[]:80",        "::1:8470",       "ftp://host:1",
                          "host :80",  "10.0.0.1",    "user@host:80", "http://u:p@h:1", "ho%73t:80",
                          "a,b:80",    "host\x01:80", "[not-v6]:80",  "[10.0.0.1]:80"}) {
    auto r = parseEndpoint(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.error().code(), ErrorCode::kInvalidArgument) << bad;
    EXPECT_NE(r.error().message().find(std::string("'") + bad + "'"), std::string::npos) << r.error().message();
  }
  auto tls = parseEndpoint("https://host:443");
  ASSERT_FALSE(tls.ok());
  EXPECT_EQ(tls.error().code(), ErrorCode::kUnsupported);
}

}  // namespace
}  // namespace dsec
