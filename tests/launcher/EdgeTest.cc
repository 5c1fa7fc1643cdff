// The shared pieces of the HTTP edge (Edge.h) on a real HttpServer: the error mapper, the JSON body reader
// and its limits, route errors and the bearer check, as the node API and the gateway both use them.
#include <gtest/gtest.h>

#include <stdexcept>

#include "HttpTestClient.h"
#include "dsec/launcher/api/Edge.h"
#include "dsec/launcher/api/Router.h"

namespace dsec::launcher {
namespace {

namespace http = boost::beast::http;
using nlohmann::json;

constexpr uint64_t kTestLimit = 64;

class EdgeHandler : public RequestHandler {
 public:
  void handle(HttpExchange& ex) override {
    static const RouteTable table = [] {
      RouteTable t;
      t.add("/json", {{http::verb::post, 1}})
          .add("/optional", {{http::verb::put, 2}})
          .add("/error/*", {{http::verb::get, 3}})
          .add("/open", {{http::verb::get, 4}})
          .add("/throw/*", {{http::verb::get, 5}});
      return t;
    }();
    TableMatch m = table.match(ex.method(), ex.target());
    if (!admitRequest(ex, "secret", RouteGate{m.error_status == 0 && m.route == 4, m.error_status, m.error, m.allow})) {
      return;
    }
    dispatchGuarded(ex, "edge test", [&] { dispatch(ex, m); });
  }

 private:
  static void dispatch(HttpExchange& ex, const TableMatch& m) {
    if (m.route == 4) return ex.sendJson(200, json{{"open", true}});
    if (m.route == 5) {
      if (m.wildcards[0] == "json") json{{"n", 1}}["n"].get<std::string>();  // a value of the wrong type
      if (m.wildcards[0] == "late") {
        ex.sendJson(200, json{{"started", true}});
        throw std::runtime_error("after the answer");
      }
      throw std::runtime_error("handler bug");
    }
    if (m.route == 1 || m.route == 2) {
      auto body = readJsonBody(ex, kTestLimit, m.route == 2 ? EmptyBody::kEmptyObject : EmptyBody::kRefuse);
      if (!body) return;
      return ex.sendJson(200, *body);
    }
    static const std::map<std::string, ErrorCode> codes = {
        {"invalid", ErrorCode::kInvalidArgument}, {"missing", ErrorCode::kNotFound},
        {"full", ErrorCode::kResourceExhausted},  {"down", ErrorCode::kUnavailable},
        {"conflict", ErrorCode::kConflict},       {"slow", ErrorCode::kTimeout},
        {"nope", ErrorCode::kUnsupported},        {"bug", ErrorCode::kInternal}};
    sendError(ex, Error(codes.at(m.wildcards[0]), "because " + m.wildcards[0]));
  }
};

class HttpEdgeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    HttpServerOptions o;
    o.listen = "127.0.0.1:0";
    server_ = HttpServer::start(o, &handler_).value();
    client_ = std::make_unique<testing::HttpTestClient>(server_->endpoint(), "secret");
  }
  EdgeHandler handler_;
  std::unique_ptr<HttpServer> server_;
  std::unique_ptr<testing::HttpTestClient> client_;
};

TEST_F(HttpEdgeTest, ErrorMapperGivesStatusCodeAndBody) {
  struct Want {
    const char* name;
    int status;
    const char* code;
  };
  for (const Want& w :
       {Want{"invalid", 400, "invalid_request"}, Want{"missing", 404, "not_found"}, Want{"conflict", 409, "conflict"},
        Want{"full", 429, "capacity"}, Want{"bug", 500, "internal"}, Want{"nope", 501, "unsupported"},
        Want{"down", 503, "unavailable"}, Want{"slow", 504, "timeout"}}) {
    auto r = client_->get(std::string("/error/") + w.name);
    EXPECT_EQ(r.status, w.status) << w.name;
    EXPECT_EQ(r.errorCode(), w.code) << w.name;
    EXPECT_EQ(r.json()["error"]["message"], std::string("because ") + w.name);
  }
  auto full = client_->get("/error/full");
  EXPECT_EQ(full.headers["retry-after"], "1");
  EXPECT_EQ(full.json()["error"]["retry_after"], 1);
}

TEST_F(HttpEdgeTest, BodyReaderLimitsAndShapes) {
  auto ok = client_->postJson("/json", json{{"a", 1}});
  EXPECT_EQ(ok.status, 200);
  EXPECT_EQ(ok.json()["a"], 1);
  auto big = client_->postJson("/json", json{{"a", std::string(kTestLimit, 'x')}});
  EXPECT_EQ(big.status, 413);
  EXPECT_EQ(big.errorCode(), "too_large");
  auto not_object = client_->request(http::verb::post, "/json", "[1,2]", {{"Content-Type", "application/json"}});
  EXPECT_EQ(not_object.status, 400);
  EXPECT_EQ(not_object.errorCode(), "invalid_request");
  auto garbage = client_->request(http::verb::post, "/json", "{nope", {{"Content-Type", "application/json"}});
  EXPECT_EQ(garbage.status, 400);
  auto empty = client_->request(http::verb::post, "/json", "");
  EXPECT_EQ(empty.status, 400);
  auto optional = client_->request(http::verb::put, "/optional", "");
  EXPECT_EQ(optional.status, 200);
  EXPECT_EQ(optional.json(), json::object());
}

TEST_F(HttpEdgeTest, RouteErrorsAndAuth) {
  auto missing = client_->get("/nowhere");
  EXPECT_EQ(missing.status, 404);
  EXPECT_EQ(missing.errorCode(), "not_found");
  auto wrong = client_->get("/json");
  EXPECT_EQ(wrong.status, 405);
  EXPECT_EQ(wrong.headers["allow"], "POST");
  auto bad_query = client_->get("/error/bug?x=%zz");
  EXPECT_EQ(bad_query.status, 400);
  client_->setToken("wrong");
  auto denied = client_->get("/error/bug");
  EXPECT_EQ(denied.status, 401);
  EXPECT_EQ(denied.headers["www-authenticate"], "Bearer");
  // The open route answers anyone; its neighbour's route errors still need the token first.
  EXPECT_EQ(client_->get("/open").status, 200);
  EXPECT_EQ(client_->get("/nowhere").status, 401);
}

TEST_F(HttpEdgeTest, AHandlersExceptionIsAnAnswerNotACrash) {
  auto bad_json = client_->get("/throw/json");
  EXPECT_EQ(bad_json.status, 400);
  EXPECT_EQ(bad_json.errorCode(), "invalid_request");
  auto bug = client_->get("/throw/bug");
  EXPECT_EQ(bug.status, 500);
  EXPECT_EQ(bug.json()["error"]["message"], "handler bug");
  // Thrown after the answer went out: the client gets that answer and the connection ends. A second answer (a
  // 500) on the kept-alive connection would be read as the reply to the next request.
  auto late = client_->get("/throw/late");
  EXPECT_EQ(late.status, 200);
  auto next = client_->get("/open");
  EXPECT_EQ(next.status, 200);
  EXPECT_EQ(next.json()["open"], true);
}

}  // namespace
}  // namespace dsec::launcher
