// The tests' HTTP client: a thin convenience over the product's client (launcher/api/HttpClient.h) with the
// test's token, keep-alive connections of its own, every answer header, and transport failures thrown. raw()
// alone writes bytes itself: it sends what no client would (malformed requests, for abuse tests).
#pragma once

#include <boost/beast/http/verb.hpp>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "dsec/launcher/api/ConnectionPool.h"
#include "dsec/launcher/api/HttpClient.h"

namespace dsec::testing {

struct HttpReply {
  int status = 0;
  std::string body;
  std::map<std::string, std::string> headers;  // lower-case names
  bool closed = false;                         // the server closed the connection after this reply
  nlohmann::json json() const;
  std::string errorCode() const;  // error.code of an error body, "" if none
};

class HttpTestClient {
 public:
  HttpTestClient(const std::string& endpoint, std::string token);
  ~HttpTestClient();

  void setToken(std::string token) { token_ = std::move(token); }
  HttpReply request(boost::beast::http::verb method, const std::string& target, const std::string& body = "",
                    const std::map<std::string, std::string>& headers = {}, bool auth = true);
  HttpReply get(const std::string& target) { return request(boost::beast::http::verb::get, target); }
  HttpReply del(const std::string& target) { return request(boost::beast::http::verb::delete_, target); }
  HttpReply postJson(const std::string& target, const nlohmann::json& body) {
    return request(boost::beast::http::verb::post, target, body.dump(), {{"Content-Type", "application/json"}});
  }
  HttpReply putJson(const std::string& target, const nlohmann::json& body) {
    return request(boost::beast::http::verb::put, target, body.dump(), {{"Content-Type", "application/json"}});
  }
  // PUT with a body produced in pieces by `next` (an empty piece ends it) and a known total size.
  HttpReply putStreamed(const std::string& target, uint64_t size,
                        const std::function<std::string(uint64_t offset)>& next);
  // GET whose body is handed to `sink` piece by piece (not kept in the reply).
  HttpReply getStreamed(const std::string& target, const std::function<void(const char*, size_t)>& sink);
  // POST of a JSON body whose 200 answer is handed to `sink` piece by piece (an error body is kept).
  HttpReply postJsonStreamed(const std::string& target, const nlohmann::json& body,
                             const std::function<void(const char*, size_t)>& sink);
  // Sends raw bytes on a fresh connection and returns what came back until the server closed it (or timeout).
  std::string raw(const std::string& bytes, double timeout_seconds = 5, bool half_close = false);

  std::string host() const { return host_; }
  int port() const { return port_; }

 private:
  // The call options of a request with these extra headers; the token goes in unless auth is false.
  launcher::client::CallOptions options(const std::map<std::string, std::string>& headers);
  std::string tokenFor(bool auth) const { return auth ? token_ : std::string(); }

  std::string endpoint_;
  std::string host_;
  int port_ = 0;
  std::string token_;
  launcher::client::ConnectionPool pool_;  // this client's keep-alive connections
};

// Resident and peak resident memory of this process in bytes (VmRSS/VmHWM); resetPeakRss() restarts VmHWM.
int64_t residentBytes();
int64_t peakResidentBytes();
void resetPeakRss();

}  // namespace dsec::testing
