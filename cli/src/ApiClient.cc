#include "ApiClient.h"

#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <limits>

#include "dsec/common/Endpoint.h"
#include "dsec/common/Strings.h"
#include "dsec/launcher/api/HttpClient.h"

namespace dsec::cli {

namespace http = boost::beast::http;
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

}  // namespace

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

struct ApiClient::Impl {
  FleetAddress address;
  Status parsed_endpoint;
  // The shared HTTP client (launcher/api/HttpClient.h) over one keep-alive connection from this pool.
  launcher::client::ConnectionPool pool{1};
  launcher::client::CallOptions options;

  explicit Impl(FleetAddress a) : address(std::move(a)) {
    // The one endpoint parser (common/Endpoint.h); an endpoint without a port means port 80.
    auto ep = parseEndpoint(address.endpoint, 80);
    if (!ep.ok()) {
      parsed_endpoint = ep.error();
    } else {
      address.endpoint = "http://" + ep->hostPort();
    }
    options.connect_timeout_ms = 10 * 1000;
    options.io_timeout_ms = -1;  // an exec or call lasts as long as its own timeout says
    options.pool = &pool;
    options.max_body_bytes = std::numeric_limits<uint64_t>::max();
    options.user_agent = "dsec-cli";
  }

  Error unreachable(const Error& e) const {
    return Error(ErrorCode::kUnavailable, "cannot reach the fleet at " + address.endpoint + ": " + e.message());
  }
};

ApiClient::ApiClient(FleetAddress address) : impl_(std::make_unique<Impl>(std::move(address))) {}
ApiClient::~ApiClient() = default;

void ApiClient::setTimeouts(double connect_seconds, double request_seconds) {
  impl_->options.connect_timeout_ms = std::max(1, static_cast<int>(connect_seconds * 1000));
  impl_->options.io_timeout_ms = request_seconds > 0 ? std::max(1, static_cast<int>(request_seconds * 1000)) : -1;
}

const FleetAddress& ApiClient::address() const { return impl_->address; }

Result<json> ApiClient::postBytes(const std::string& target, const std::string& data) {
  DSEC_TRY(impl_->parsed_endpoint);
  launcher::client::CallOptions options = impl_->options;
  options.headers.emplace_back("Content-Type", "application/octet-stream");
  auto reply =
      launcher::client::call(impl_->address.endpoint, http::verb::post, target, impl_->address.token, data, options);
  if (!reply.ok()) return impl_->unreachable(reply.error());
  if (reply->status < 200 || reply->status >= 300) return errorFromResponse(reply->status, reply->body);
  json parsed = json::parse(reply->body, nullptr, false);
  if (parsed.is_discarded()) return Error::internal("the server sent invalid JSON for " + target);
  return parsed;
}

Result<json> ApiClient::call(HttpMethod method, const std::string& target, const json& body) {
  static const http::verb kVerbs[] = {http::verb::get, http::verb::post, http::verb::put, http::verb::delete_};
  DSEC_TRY(impl_->parsed_endpoint);
  auto reply = launcher::client::call(impl_->address.endpoint, kVerbs[static_cast<int>(method)], target,
                                      impl_->address.token, body.is_null() ? "" : body.dump(), impl_->options);
  if (!reply.ok()) return impl_->unreachable(reply.error());
  if (reply->status < 200 || reply->status >= 300) return errorFromResponse(reply->status, reply->body);
  if (reply->body.empty()) return json::object();
  json parsed = json::parse(reply->body, nullptr, false);
  if (parsed.is_discarded()) return Error::internal("the server sent invalid JSON for " + target);
  return parsed;
}

Result<json> ApiClient::stream(const std::string& target, const json& body,
                               const std::function<void(const json&)>& on_line) {
  DSEC_TRY(impl_->parsed_endpoint);
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
  // Lines are handled as pieces arrive, so output reaches the terminal while the command runs.
  auto on_body = [&](const char* data, size_t size) {
    pending.append(data, size);
    size_t start = 0;
    for (auto nl = pending.find('\n'); nl != std::string::npos; nl = pending.find('\n', start)) {
      handle_line(pending.substr(start, nl - start));
      start = nl + 1;
    }
    pending.erase(0, start);
    return true;
  };
  auto reply = launcher::client::callStreaming(impl_->address.endpoint, http::verb::post, target, impl_->address.token,
                                               body.dump(), impl_->options, on_body);
  if (!reply.ok()) return impl_->unreachable(reply.error());
  if (reply->status < 200 || reply->status >= 300) return errorFromResponse(reply->status, reply->body);
  handle_line(pending);
  if (bad_line) return Error::internal("the server sent a malformed stream line for " + target);
  if (!last.is_object() || !last.value("done", false)) {
    return Error(ErrorCode::kUnavailable, "the exec stream ended without a result (connection lost?)");
  }
  return last;
}

}  // namespace dsec::cli
