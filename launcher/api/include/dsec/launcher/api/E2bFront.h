// The E2B-compatible listener (docs/e2b.md): E2B's SDKs pointed at a dsec node or gateway with E2B_API_URL and
// E2B_SANDBOX_URL both set to this listener. It translates E2B's control plane (REST) and the in-sandbox daemon's
// services (envd: Connect RPCs and /files) into calls of dsec's own API on the node or gateway it fronts, so it
// works the same in front of either, and nothing runs inside the sandbox for it: envd's part is played from outside,
// as dsec's exec is.
//
// Authentication: the control plane's X-API-KEY is the fleet's token. Each sandbox's envdAccessToken is an HMAC of
// its id under that token, so a data-plane request (which carries the sandbox id and that token, not the API key)
// proves it was given the sandbox by someone holding the API key.
#pragma once

#include <atomic>
#include <map>
#include <mutex>
#include <string>

#include "dsec/launcher/api/ConnectionPool.h"
#include "dsec/launcher/api/HttpServer.h"
#include "dsec/launcher/api/Router.h"

namespace dsec::launcher {

struct E2bOptions {
  std::string listen;  // "ADDR:PORT"; "" : no E2B listener
  // E2B template id -> dsec image; "base" (the SDKs' default) and templates not in it use default_image when set.
  std::map<std::string, std::string> templates;
  std::string default_image;

  bool operator==(const E2bOptions&) const = default;
};
// The listener's address and images, checked: a listen address, images that parse. `flag` prefixes messages.
Status validateE2bOptions(const E2bOptions& options, const std::string& flag_prefix);

// "NAME=IMAGE" of --e2b-template.
Status addE2bTemplate(E2bOptions& options, const std::string& spec);

// The envd version the listener reports: the SDK picks its calls by it (docs/e2b.md).
inline constexpr const char* kE2bEnvdVersion = "0.5.7";

class E2bFront : public RequestHandler {
 public:
  // upstream: the dsec API this fronts ("http://127.0.0.1:PORT") and its token.
  E2bFront(E2bOptions options, std::string upstream, std::string token);
  void handle(HttpExchange& ex) override;

  // The envdAccessToken of a sandbox: hex HMAC-SHA256 of "envd:" + id under the fleet's token.
  static std::string envdAccessToken(const std::string& token, const std::string& sandbox_id);

 private:
  // Control plane (E2bFront.cc).
  void controlPlane(HttpExchange& ex);
  void createSandbox(HttpExchange& ex);
  void listSandboxes(HttpExchange& ex, const QueryParams& query);
  void connectSandbox(HttpExchange& ex, const std::string& id);
  // Data plane (E2bEnvd.cc): the sandbox id is checked against its access token first.
  void envd(HttpExchange& ex, const std::string& sandbox_id);
  void processStart(HttpExchange& ex, const std::string& id);
  // SendSignal, SendInput, CloseStdin of a command this listener started (by its pid).
  void processControl(HttpExchange& ex, const std::string& id, const std::string& method);
  void filesystemCall(HttpExchange& ex, const std::string& id, const std::string& method);
  void readFile(HttpExchange& ex, const std::string& id);
  void writeFile(HttpExchange& ex, const std::string& id);

  // A dsec API call with a whole answer (JSON routes).
  struct Upstream {
    int status = 0;
    std::string body;
    std::vector<std::pair<std::string, std::string>> headers;
  };
  Upstream call(boost::beast::http::verb method, const std::string& target, const std::string& body);
  // E2B's control-plane error shape {"code", "message"} for a dsec answer that is not 2xx (Retry-After kept).
  void relayError(HttpExchange& ex, const Upstream& answer);
  std::string imageFor(const std::string& template_id) const;

  E2bOptions options_;
  std::string upstream_;
  std::string token_;
  client::ConnectionPool pool_;
  std::atomic<uint32_t> next_pid_{1000};
  // The commands running through this listener: E2B pid -> (sandbox id, dsec exec id).
  std::mutex procs_mu_;
  std::map<uint32_t, std::pair<std::string, std::string>> procs_;
};

}  // namespace dsec::launcher
