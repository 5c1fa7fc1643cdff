#include "ApiClient.h"

#include <pwd.h>
#include <unistd.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cstdlib>
#include <limits>

#include "dsec/common/Endpoint.h"
#include "dsec/common/Strings.h"

namespace dsec::cli {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using nlohmann::json;

namespace {

std::string homeDir() {
  const char* home = std::getenv("HOME");
  if (home != nullptr && *home != '\0') return home;
  const passwd* pw = getpwuid(getuid());
  return pw != nullptr ? pw->pw_dir : "/root";
}

ErrorCode codeForStatus(unsigned status) {
  switch (status) {
    case 400:
    case 413:
      return ErrorCode::kInvalidArgument;
    case 401:
      return ErrorCode::kUnauthenticated;
    case 404:
      return ErrorCode::kNotFound;
    case 409:
      return ErrorCode::kConflict;
    case 429:
      return ErrorCode::kResourceExhausted;
    case 501:
      return ErrorCode::kUnsupported;
    case 503:
      return ErrorCode::kUnavailable;
    case 504:
      return ErrorCode::kTimeout;
    default:
      return ErrorCode::kInternal;
  }
}

// "404 not_found: no sandbox n0-12" from the error body of docs/api.md, or the raw body if it is not JSON.
Error errorFromResponse(unsigned status, const std::string& body) {
  std::string text = std::to_string(status);
  json parsed = json::parse(body, nullptr, false);
  if (!parsed.is_discarded() && parsed.is_object() && parsed.contains("error") && parsed["error"].is_object()) {
    const json& err = parsed["error"];
    if (err.contains("code") && err["code"].is_string()) text += " " + err["code"].get<std::string>();
    if (err.contains("message") && err["message"].is_string()) text += ": " + err["message"].get<std::string>();
  } else if (!body.empty()) {
    text += ": " + trim(body.substr(0, 500));
  }
  return Error(codeForStatus(status), text);
}

}  // namespace

Result<FleetAddress> resolveFleet(const std::string& fleet, bool prefer_file) {
  const char* endpoint = std::getenv("DSEC_ENDPOINT");
  const char* token = std::getenv("DSEC_TOKEN");
  if (!prefer_file && endpoint != nullptr && *endpoint != '\0') {
    return FleetAddress{endpoint, token != nullptr ? token : ""};
  }
  std::string path = homeDir() + "/.dsec/fleets/" + fleet + ".json";
  auto text = readFile(path);
  if (!text.ok()) {
    return Error(ErrorCode::kNotFound, "no fleet '" + fleet + "': " + text.error().message() +
                                           " (start one with `dsec serve`, or set DSEC_ENDPOINT and DSEC_TOKEN)");
  }
  json parsed = json::parse(*text, nullptr, false);
  if (parsed.is_discarded() || !parsed.is_object() || !parsed.contains("endpoint") || !parsed["endpoint"].is_string()) {
    return Error::invalid(path + ": not a fleet file (want {\"endpoint\": ..., \"token\": ...})");
  }
  FleetAddress address{parsed["endpoint"].get<std::string>(), ""};
  if (parsed.contains("token") && parsed["token"].is_string()) address.token = parsed["token"].get<std::string>();
  return address;
}

std::string urlEncode(const std::string& text) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : text) {
    if (std::isalnum(c) != 0 || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

struct ApiClient::Impl {
  FleetAddress address;
  std::string host;
  std::string port;
  std::string host_port;  // for the Host header ("[::1]:8470")
  Status parsed_endpoint;
  asio::io_context io;
  tcp::socket socket{io};
  beast::flat_buffer buffer;
  bool used = false;  // the open connection already carried a request (the server may have closed it)

  explicit Impl(FleetAddress a) : address(std::move(a)) { parsed_endpoint = parseEndpoint(); }

  Status parseEndpoint() {
    // The one endpoint parser (common/Endpoint.h); an endpoint without a port means port 80.
    auto ep = dsec::parseEndpoint(address.endpoint, 80);
    if (!ep.ok()) return ep.error();
    host = ep->host;
    port = std::to_string(ep->port);
    host_port = ep->hostPort();
    return okStatus();
  }

  void closeSocket() {
    beast::error_code ignored;
    socket.shutdown(tcp::socket::shutdown_both, ignored);
    socket.close(ignored);
    buffer.clear();
    used = false;
  }

  Status ensureConnected() {
    DSEC_TRY(parsed_endpoint);
    if (socket.is_open()) return okStatus();
    beast::error_code ec;
    tcp::resolver resolver(io);
    auto results = resolver.resolve(host, port, ec);
    if (!ec) asio::connect(socket, results, ec);
    if (ec) {
      closeSocket();
      return Error(ErrorCode::kUnavailable, "cannot reach the fleet at " + address.endpoint + ": " + ec.message());
    }
    socket.set_option(tcp::no_delay(true), ec);
    return okStatus();
  }

  http::request<http::string_body> makeRequest(http::verb verb, const std::string& target, const json& body) {
    http::request<http::string_body> req{verb, target, 11};
    req.set(http::field::host, host_port);
    req.set(http::field::user_agent, "dsec-cli");
    if (!address.token.empty()) req.set(http::field::authorization, "Bearer " + address.token);
    req.keep_alive(true);
    if (!body.is_null()) {
      req.set(http::field::content_type, "application/json");
      req.body() = body.dump();
    }
    req.prepare_payload();
    return req;
  }

  // Writes the request and reads the response into parser. A request on a reused keep-alive connection that
  // the server closed meanwhile fails before any response byte: reconnect once and resend.
  template <typename Parser, typename MakeParser>
  Status roundTrip(const http::request<http::string_body>& req, std::unique_ptr<Parser>& parser,
                   const MakeParser& make_parser) {
    for (int attempt = 0;; ++attempt) {
      DSEC_TRY(ensureConnected());
      bool reused = used;
      used = true;
      parser = make_parser();
      beast::error_code ec;
      http::write(socket, req, ec);
      if (!ec) http::read(socket, buffer, *parser, ec);
      if (!ec) {
        if (!parser->get().keep_alive()) closeSocket();
        return okStatus();
      }
      bool got_nothing = !parser->got_some();
      closeSocket();
      if (reused && got_nothing && attempt == 0) continue;
      return Error(ErrorCode::kUnavailable, "talking to the fleet at " + address.endpoint + ": " + ec.message());
    }
  }
};

ApiClient::ApiClient(FleetAddress address) : impl_(std::make_unique<Impl>(std::move(address))) {}
ApiClient::~ApiClient() = default;

Result<json> ApiClient::call(HttpMethod method, const std::string& target, const json& body) {
  static const http::verb kVerbs[] = {http::verb::get, http::verb::post, http::verb::put, http::verb::delete_};
  auto req = impl_->makeRequest(kVerbs[static_cast<int>(method)], target, body);
  using Parser = http::response_parser<http::string_body>;
  std::unique_ptr<Parser> parser;
  DSEC_TRY(impl_->roundTrip(req, parser, [] {
    auto p = std::make_unique<Parser>();
    p->body_limit(std::numeric_limits<std::uint64_t>::max());  // boost::none rejects bodies in Beast 1.74
    return p;
  }));
  const auto& res = parser->get();
  unsigned status = res.result_int();
  if (status < 200 || status >= 300) return errorFromResponse(status, res.body());
  if (res.body().empty()) return json::object();
  json parsed = json::parse(res.body(), nullptr, false);
  if (parsed.is_discarded()) return Error::internal("the server sent invalid JSON for " + target);
  return parsed;
}

Result<json> ApiClient::stream(const std::string& target, const json& body,
                               const std::function<void(const json&)>& on_line) {
  auto req = impl_->makeRequest(http::verb::post, target, body);
  std::string pending;  // bytes of an incomplete line
  json last;
  bool bad_line = false;
  auto handle_line = [&](const std::string& line) {
    if (trim(line).empty()) return;
    json parsed = json::parse(line, nullptr, false);
    if (parsed.is_discarded()) {
      bad_line = true;
      return;
    }
    last = parsed;
    on_line(parsed);
  };
  auto consume_lines = [&] {
    size_t start = 0;
    for (auto nl = pending.find('\n'); nl != std::string::npos; nl = pending.find('\n', start)) {
      handle_line(pending.substr(start, nl - start));
      start = nl + 1;
    }
    pending.erase(0, start);
  };
  using Parser = http::response_parser<http::string_body>;
  std::unique_ptr<Parser> parser;
  Parser* current = nullptr;
  // Lines are handled as chunks arrive, so output reaches the terminal while the command runs. Beast keeps a
  // reference to the callback, so it lives here, outside the parser.
  auto on_chunk = [&](std::uint64_t, beast::string_view data, beast::error_code&) -> std::size_t {
    if (current->get().result_int() != 200) return 0;  // an error body: keep it for the message
    pending.append(data.data(), data.size());
    consume_lines();
    return data.size();
  };
  DSEC_TRY(impl_->roundTrip(req, parser, [&] {
    pending.clear();
    auto p = std::make_unique<Parser>();
    p->body_limit(std::numeric_limits<std::uint64_t>::max());  // boost::none rejects bodies in Beast 1.74
    p->on_chunk_body(on_chunk);
    current = p.get();
    return p;
  }));
  const auto& res = parser->get();
  unsigned status = res.result_int();
  if (status < 200 || status >= 300) return errorFromResponse(status, res.body());
  // A server that did not chunk the response sends the lines as a plain body.
  pending += res.body();
  consume_lines();
  handle_line(pending);
  if (bad_line) return Error::internal("the server sent a malformed stream line for " + target);
  if (!last.is_object() || !last.value("done", false)) {
    return Error(ErrorCode::kUnavailable, "the exec stream ended without a result (connection lost?)");
  }
  return last;
}

}  // namespace dsec::cli
