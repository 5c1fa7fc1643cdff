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

TEST(ListenAddressParse, AcceptsAddressesPortZeroAndEveryInterface) {
  struct Case {
    const char* text;
    const char* host;
    int port;
  };
  for (const Case& c : {Case{"127.0.0.1:8470", "127.0.0.1", 8470}, Case{"127.0.0.1:0", "127.0.0.1", 0},
                        Case{"[::1]:0", "::1", 0}, Case{"[::]:65535", "::", 65535}, Case{":8470", "0.0.0.0", 8470},
                        Case{"0.0.0.0:1", "0.0.0.0", 1}, Case{"node-1.cluster:80", "node-1.cluster", 80}}) {
    auto a = parseListenAddress(c.text);
    ASSERT_OK(a);
    EXPECT_EQ(a->host, c.host) << c.text;
    EXPECT_EQ(a->port, c.port) << c.text;
  }
}

TEST(ListenAddressParse, RefusesBadInputsClearly) {
  for (const char* bad : {"", "8470", "127.0.0.1", "127.0.0.1:", "127.0.0.1:70000", "host:port", "host:-1", "::1:8470",
                          "[::1]", "[::1", "[]:80", ":", "[10.0.0.1]:80", "http://127.0.0.1:80", "127.0.0.1:80/",
                          "host :80", "user@host:80", "host\x01:80"}) {
    auto r = parseListenAddress(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.error().code(), ErrorCode::kInvalidArgument) << bad;
    EXPECT_NE(r.error().message().find(std::string("listen address '") + bad + "'"), std::string::npos)
        << r.error().message();
  }
  EXPECT_NE(parseListenAddress("::1:8470").error().message().find("brackets"), std::string::npos);
  EXPECT_NE(parseListenAddress("h:99999").error().message().find("out of range"), std::string::npos);
}

}  // namespace
}  // namespace dsec
