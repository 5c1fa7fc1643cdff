// What the node API (ApiServer) and the fleet gateway share at the HTTP edge, so both answer alike: the body
// limits, the bearer check, the JSON body reader, the mapping of dsec errors to HTTP answers, route errors and
// the /metrics answer. Routing itself is RouteTable (Router.h).
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "dsec/common/Result.h"
#include "dsec/launcher/api/HttpServer.h"

namespace dsec::launcher {

constexpr uint64_t kJsonBodyLimit = 1 << 20;      // create and other small bodies
constexpr uint64_t kExecBodyLimit = 64ULL << 20;  // exec carries stdin
constexpr uint64_t kDiscardLimit = 1 << 20;       // an unread body skipped to keep the connection

// Whether the request's Authorization header carries `token` (bearerTokenMatches).
bool requestAuthorized(const HttpExchange& ex, std::string_view token);
// 401 with WWW-Authenticate: Bearer.
void sendUnauthorized(HttpExchange& ex);

// A request's route as the edge sees it before dispatch: whether it is open to anyone (GET /healthz) and, when
// it matched no route, the answer to give (TableMatch/RouteMatch error).
struct RouteGate {
  bool open = false;
  int error_status = 0;
  std::string error;
  std::string allow;  // for 405
};
// The gate every request of the node and the gateway passes, in this order: the bearer check (an authenticated
// connection leaves its client's unauthenticated budget), 401 unless the route is open, then the route error.
// True when the caller should dispatch; otherwise the answer has been sent.
bool admitRequest(HttpExchange& ex, std::string_view token, const RouteGate& route);
// Runs a route's handler so that no exception reaches the transport: a bad JSON value is 400, anything else 500
// (logged with `op`); when the answer had already started, the connection is closed instead.
void dispatchGuarded(HttpExchange& ex, std::string_view op, const std::function<void()>& handler);

// The one error mapper: the status and code of httpStatusFor(), the message, and for 429 Retry-After: 1 (and
// "retry_after" in the body). A 500 is logged with the request line.
void sendError(HttpExchange& ex, const Error& error);
// A route that did not match (TableMatch/RouteMatch error): the body is skipped; 405 carries Allow.
void sendRouteError(HttpExchange& ex, int status, const std::string& message, const std::string& allow);

// Reads a whole body of at most `limit` bytes; on failure it has answered (413 too_large, or the mapped error
// of the failed read unless the client is gone) and returns nullopt.
std::optional<std::string> readBodyOrAnswer(HttpExchange& ex, uint64_t limit);
// What readJsonBody does with an empty (or absent) body.
enum class EmptyBody { kRefuse, kEmptyObject };
// Reads a JSON object body of at most `limit` bytes. On failure it has answered (413 too_large, 400 for bad
// JSON or a non-object, the mapped error of a failed read unless the client is gone) and returns nullopt.
std::optional<nlohmann::json> readJsonBody(HttpExchange& ex, uint64_t limit, EmptyBody empty = EmptyBody::kRefuse);

// 200 with the Prometheus text (prometheus::kContentType).
void sendMetrics(HttpExchange& ex, std::string text);

}  // namespace dsec::launcher
