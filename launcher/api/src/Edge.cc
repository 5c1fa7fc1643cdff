#include "dsec/launcher/api/Edge.h"

#include <exception>
#include <new>

#include "dsec/common/Logging.h"
#include "dsec/common/Prometheus.h"
#include "dsec/launcher/api/Requests.h"

namespace dsec::launcher {

namespace http = boost::beast::http;
using nlohmann::json;

bool requestAuthorized(const HttpExchange& ex, std::string_view token) {
  auto it = ex.head().find(http::field::authorization);
  if (it == ex.head().end()) return false;
  return bearerTokenMatches(std::string_view(it->value().data(), it->value().size()), token);
}

void sendUnauthorized(HttpExchange& ex) {
  ex.sendError(401, "unauthorized", "missing or wrong bearer token (Authorization: Bearer <token>)",
               {{"WWW-Authenticate", "Bearer"}});
}

bool admitRequest(HttpExchange& ex, std::string_view token, const RouteGate& route) {
  const bool authed = requestAuthorized(ex, token);
  if (authed) ex.markAuthenticated();
  if (!authed && !route.open) {
    sendUnauthorized(ex);
    return false;
  }
  if (route.error_status != 0) {
    sendRouteError(ex, route.error_status, route.error, route.allow);
    return false;
  }
  return true;
}

void dispatchGuarded(HttpExchange& ex, std::string_view op, const std::function<void()>& handler) {
  auto fail = [&](int status, const char* code, const std::string& message) {
    if (!ex.responded()) {
      ex.sendError(status, code, message);
    } else {
      ex.forceClose();  // the answer had started: a second one would corrupt the stream
    }
  };
  try {
    handler();
  } catch (const json::exception& e) {
    fail(400, "invalid_request", std::string("bad JSON value: ") + e.what());
  } catch (const std::bad_alloc&) {
    fail(500, "internal", "out of memory");
    ex.forceClose();
  } catch (const std::exception& e) {
    DSEC_LOG(kError, "api") << op << ": " << e.what();
    fail(500, "internal", e.what());
  }
}

void sendError(HttpExchange& ex, const Error& error) {
  auto [status, code] = httpStatusFor(error.code());
  if (status == 429) {
    ex.sendError(status, code, error.message(), {{"Retry-After", "1"}}, json{{"retry_after", 1}});
    return;
  }
  if (status == 500) DSEC_LOG(kWarn, "api") << ex.method() << " " << ex.target() << ": " << error.toString();
  ex.sendError(status, code, error.message());
}

void sendRouteError(HttpExchange& ex, int status, const std::string& message, const std::string& allow) {
  ex.discardBody(kDiscardLimit);
  if (status == 405) {
    ex.sendError(405, "invalid_request", message, {{"Allow", allow}});
  } else {
    ex.sendError(status, status == 404 ? "not_found" : "invalid_request", message);
  }
}

std::optional<std::string> readBodyOrAnswer(HttpExchange& ex, uint64_t limit) {
  bool too_large = false;
  auto body = ex.readBody(limit, &too_large);
  if (!body.ok()) {
    if (too_large) {
      ex.sendError(413, "too_large", body.error().message());
    } else if (!ex.broken()) {
      sendError(ex, body.error());
    }
    return std::nullopt;
  }
  return std::move(*body);
}

std::optional<json> readJsonBody(HttpExchange& ex, uint64_t limit, EmptyBody empty) {
  if (empty == EmptyBody::kEmptyObject && !ex.hasBody()) return json::object();
  auto body = readBodyOrAnswer(ex, limit);
  if (!body) return std::nullopt;
  if (empty == EmptyBody::kEmptyObject && body->empty()) return json::object();
  auto parsed = parseJsonObject(*body);
  if (!parsed.ok()) {
    sendError(ex, parsed.error());
    return std::nullopt;
  }
  return std::move(*parsed);
}

void sendMetrics(HttpExchange& ex, std::string text) { ex.sendText(200, prometheus::kContentType, std::move(text)); }

}  // namespace dsec::launcher
