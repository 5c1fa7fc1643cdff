// Routing of the node API: paths, methods (405 with Allow), ids and query strings.
#include <gtest/gtest.h>

#include "dsec/launcher/api/ApiServer.h"
#include "dsec/launcher/api/Router.h"
#include "dsec/launcher/node/Metrics.h"

namespace dsec::launcher {
namespace {

using boost::beast::http::verb;

TEST(Router, MatchesEveryRoute) {
  struct Case {
    verb method;
    const char* target;
    Op op;
  };
  for (const auto& c : std::vector<Case>{
           {verb::get, "/healthz", Op::kHealthz},
           {verb::get, "/metrics", Op::kMetrics},
           {verb::get, "/v1/node", Op::kNodeInfo},
           {verb::get, "/v1/layers", Op::kListLayers},
           {verb::get, "/v1/sandboxes", Op::kListSandboxes},
           {verb::get, "/v1/sandboxes/", Op::kListSandboxes},
           {verb::post, "/v1/sandboxes", Op::kCreateSandbox},
           {verb::get, "/v1/sandboxes/n0-abc", Op::kGetSandbox},
           {verb::delete_, "/v1/sandboxes/n0-abc", Op::kDestroySandbox},
           {verb::post, "/v1/sandboxes/n0-abc/pause", Op::kPause},
           {verb::post, "/v1/sandboxes/n0-abc/resume", Op::kResume},
           {verb::post, "/v1/sandboxes/n0-abc/exec", Op::kExec},
           {verb::post, "/v1/sandboxes/n0-abc/exec/stream", Op::kExecStream},
           {verb::get, "/v1/sandboxes/n0-abc/files?path=/a", Op::kReadFile},
           {verb::put, "/v1/sandboxes/n0-abc/files?path=/a", Op::kWriteFile},
           {verb::delete_, "/v1/sandboxes/n0-abc/files?path=/a", Op::kRemoveFile},
           {verb::get, "/v1/sandboxes/n0-abc/files/list?path=/a", Op::kListDir},
           {verb::get, "/v1/sandboxes/n0-abc/files/stat?path=/a", Op::kStatFile},
           {verb::get, "/v1/sandboxes/n0-abc/tar?path=/a", Op::kGetTar},
           {verb::put, "/v1/sandboxes/n0-abc/tar?path=/a", Op::kPutTar},
       }) {
    auto m = matchRoute(c.method, c.target);
    EXPECT_EQ(m.error_status, 0) << c.target << ": " << m.error;
    EXPECT_EQ(m.op, c.op) << c.target;
  }
  EXPECT_EQ(matchRoute(verb::get, "/v1/sandboxes/n0-abc/files?path=/a").sandbox_id, "n0-abc");
}

TEST(Router, UnknownPathsAre404AndWrongMethods405) {
  EXPECT_EQ(matchRoute(verb::get, "/").error_status, 404);
  EXPECT_EQ(matchRoute(verb::get, "/v2/node").error_status, 404);
  EXPECT_EQ(matchRoute(verb::get, "/v1/sandboxes/x/nothing").error_status, 404);
  auto m = matchRoute(verb::put, "/v1/sandboxes");
  EXPECT_EQ(m.error_status, 405);
  EXPECT_EQ(m.allow, "GET, POST");
  EXPECT_EQ(matchRoute(verb::post, "/healthz").error_status, 405);
  EXPECT_EQ(matchRoute(verb::get, "/v1/sandboxes/x/exec").error_status, 405);
}

TEST(Router, BadIdsAndQueries) {
  EXPECT_EQ(matchRoute(verb::get, "/v1/sandboxes/..").error_status, 404);
  EXPECT_EQ(matchRoute(verb::get, "/v1/sandboxes/a%2Fb").error_status, 404);
  EXPECT_EQ(matchRoute(verb::get, "/v1/sandboxes/x/files?path=%zz").error_status, 400);
  EXPECT_EQ(matchRoute(verb::get, "/v1/sandboxes/x/files?path=%4").error_status, 400);
  auto m = matchRoute(verb::get, "/v1/sandboxes?label=a%3D1&label=b=2+3&flag");
  ASSERT_EQ(m.error_status, 0);
  EXPECT_EQ(m.query.all("label"), (std::vector<std::string>{"a=1", "b=2 3"}));
  EXPECT_TRUE(m.query.has("flag"));
  EXPECT_EQ(m.query.get("missing", "dflt"), "dflt");
}

TEST(ApiHelpers, Utf8Boundaries) {
  EXPECT_EQ(completeUtf8Prefix("abc"), 3u);
  EXPECT_EQ(completeUtf8Prefix("a\xc3"), 1u);             // first byte of a 2-byte sequence
  EXPECT_EQ(completeUtf8Prefix("a\xc3\xa9"), 3u);         // complete é
  EXPECT_EQ(completeUtf8Prefix("a\xe2\x82"), 1u);         // 2 of 3 bytes of €
  EXPECT_EQ(completeUtf8Prefix("\xf0\x9f\x98\x80"), 4u);  // complete emoji
  EXPECT_EQ(completeUtf8Prefix("\xf0\x9f\x98"), 0u);
  EXPECT_EQ(completeUtf8Prefix("\xff\xfe"), 2u);  // invalid bytes are passed on (replaced later)
}

TEST(Metrics, RendersPrometheusText) {
  Metrics m;
  m.creates_total += 3;
  m.create_seconds.observe(0.002);
  m.create_seconds.observe(0.2);
  m.countHttpRequest(200);
  m.countHttpRequest(200);
  m.countHttpRequest(404);
  m.setGaugeRenderer([](std::string* out) { *out += "dsec_sandboxes{state=\"running\"} 2\n"; });
  std::string text = m.render();
  EXPECT_NE(text.find("dsec_sandbox_creates_total 3\n"), std::string::npos) << text;
  EXPECT_NE(text.find("dsec_http_requests_total{code=\"200\"} 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("dsec_http_requests_total{code=\"404\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("dsec_sandbox_create_seconds_bucket{le=\"0.0025\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("dsec_sandbox_create_seconds_bucket{le=\"+Inf\"} 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("dsec_sandbox_create_seconds_count 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("dsec_sandboxes{state=\"running\"} 2\n"), std::string::npos) << text;
}

TEST(RouterTable, MatchesPatternsWildcardsAndMethods) {
  RouteTable t;
  t.add("/a", {{verb::get, 1}, {verb::post, 2}})
      .add("/a/*", {{verb::delete_, 3}})
      .add("/a/*/b", {{verb::put, 4}})
      .addAnyMethod("/f/**", 5);
  auto m = t.match(verb::post, "/a/?x=1&y=a%20b");
  EXPECT_EQ(m.error_status, 0);
  EXPECT_EQ(m.route, 2);
  EXPECT_EQ(m.path, "/a");
  EXPECT_EQ(m.query.get("y"), "a b");
  m = t.match(verb::put, "/a/x1/b");
  EXPECT_EQ(m.route, 4);
  ASSERT_EQ(m.wildcards.size(), 1u);
  EXPECT_EQ(m.wildcards[0], "x1");
  m = t.match(verb::patch, "/f/n1-abc/files/list?path=/");
  EXPECT_EQ(m.route, 5);
  ASSERT_EQ(m.wildcards.size(), 1u);
  EXPECT_EQ(m.wildcards[0], "n1-abc/files/list");
  EXPECT_EQ(t.match(verb::get, "/f").error_status, 404);  // "**" needs at least one segment
}

TEST(RouterTable, RefusesUnknownPathsMethodsAndQueries) {
  RouteTable t;
  t.add("/a", {{verb::get, 1}, {verb::post, 2}}).add("/a/*", {{verb::delete_, 3}});
  auto m = t.match(verb::put, "/a");
  EXPECT_EQ(m.error_status, 405);
  EXPECT_EQ(m.allow, "GET, POST");
  EXPECT_EQ(m.route, 1);  // the path matched
  EXPECT_NE(m.error.find("not allowed on /a"), std::string::npos) << m.error;
  m = t.match(verb::get, "/a/b/c");
  EXPECT_EQ(m.error_status, 404);
  EXPECT_EQ(m.error, "no route /a/b/c");
  m = t.match(verb::get, "/a?x=%2");
  EXPECT_EQ(m.error_status, 400);
  EXPECT_NE(m.error.find("malformed query string"), std::string::npos);
}

TEST(RouterQuery, ParsesEachKeyAndValueOnceAndRefusesBadEscapes) {
  auto q = queryOf("/files?path=%2Ftmp%2Fa%2541&username=user&flag&empty=");
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->get("path"), "/tmp/a%41");  // decoded once: a literal '%' in a name survives
  EXPECT_EQ(q->get("username"), "user");
  EXPECT_TRUE(q->has("flag"));
  EXPECT_TRUE(q->has("empty"));
  EXPECT_TRUE(queryOf("/no-query")->values.empty());
  EXPECT_FALSE(parseQuery("path=%zz").ok());
  auto nested = parseQuery(parseQuery("metadata=run%3Dr%2526x")->get("metadata"));  // a query string in a value
  ASSERT_TRUE(nested.ok());
  EXPECT_EQ(nested->get("run"), "r&x");
}

}  // namespace
}  // namespace dsec::launcher
