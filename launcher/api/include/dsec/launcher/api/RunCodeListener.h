// The optional listener without authentication of a node (`--run-code-listen ADDR:PORT`) and of the fleet's
// gateways (`dsec-launch --gateway-run-code-listen ADDR:PORT`): it serves only POST /run_code, for SandboxFusion
// clients that send no token. Anyone who reaches the address can run code on the fleet's fncall workers and in
// fresh sandboxes: an operator binds it to a private address (docs/security.md, "The /run_code listener").
#pragma once

#include <functional>
#include <string>

#include "dsec/launcher/api/HttpServer.h"

namespace dsec::launcher {

class RunCodeListener : public RequestHandler {
 public:
  // serve answers one POST /run_code (ApiServer::runCode, Gateway::runCode); on_response counts answers.
  RunCodeListener(std::function<void(HttpExchange&)> serve, std::function<void(int)> on_response)
      : serve_(std::move(serve)), on_response_(std::move(on_response)) {}
  void handle(HttpExchange& ex) override;
  void onResponse(int status) override {
    if (on_response_) on_response_(status);
  }

 private:
  std::function<void(HttpExchange&)> serve_;
  std::function<void(int)> on_response_;
};

// An answer to POST /run_code that could not run: runCodeErrorJson (SandboxFusion's shape plus dsec's error
// object) with the status; a 429 carries Retry-After.
void sendRunCodeError(HttpExchange& ex, int status, const std::string& code, const std::string& message,
                      const HttpExchange::Fields& extra = {});

}  // namespace dsec::launcher
