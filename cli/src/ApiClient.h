// A synchronous HTTP/1.1 + JSON client for the node API (docs/api.md) over one keep-alive connection, on the
// shared HTTP client (launcher/api/HttpClient.h).
// Not thread-safe: each thread that talks to the fleet owns its own ApiClient (and so its own connection).
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "dsec/common/Result.h"

namespace dsec::cli {

struct FleetAddress {
  std::string endpoint;  // "http://127.0.0.1:8470"
  std::string token;
};

// DSEC_ENDPOINT + DSEC_TOKEN from the environment (unless prefer_file), else ~/.dsec/fleets/<fleet>.json.
Result<FleetAddress> resolveFleet(const std::string& fleet, bool prefer_file);

// "404 not_found: no sandbox n0-12" from an API error body (docs/api.md), or the raw body if it is not JSON.
Error errorFromResponse(unsigned status, const std::string& body);

enum class HttpMethod { kGet, kPost, kPut, kDelete };

class ApiClient {
 public:
  explicit ApiClient(FleetAddress address);
  ~ApiClient();
  ApiClient(const ApiClient&) = delete;
  ApiClient& operator=(const ApiClient&) = delete;

  // Seconds to connect, and a request may wait without an answer byte (0: no limit).
  void setTimeouts(double connect_seconds, double request_seconds);
  const FleetAddress& address() const;
  // POSTs raw bytes (application/octet-stream) and returns the parsed JSON answer, as call().
  Result<nlohmann::json> postBytes(const std::string& target, const std::string& data);
  // Sends a request (body serialized when not null) and returns the parsed JSON response. A non-2xx response
  // becomes an Error with the server's code and message ("404 not_found: no sandbox n0-12").
  Result<nlohmann::json> call(HttpMethod method, const std::string& target,
                              const nlohmann::json& body = nlohmann::json());
  // POSTs body to an ndjson streaming route and calls on_line for every JSON line as it arrives. Returns the
  // last line (the one with "done": true).
  Result<nlohmann::json> stream(const std::string& target, const nlohmann::json& body,
                                const std::function<void(const nlohmann::json&)>& on_line);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsec::cli
