// The node API (docs/api.md) on top of HttpServer: authentication, routing, validation and the mapping of
// dsec errors to HTTP statuses. Every handler turns bad input into a 4xx JSON error; nothing a client sends
// escapes as an exception. Buffered exec and call output is held within one node-wide budget (OutputBudget.h).
#pragma once

#include <string>

#include "dsec/launcher/api/Edge.h"
#include "dsec/launcher/api/HangUpWatch.h"
#include "dsec/launcher/api/HttpServer.h"
#include "dsec/launcher/api/OutputBudget.h"
#include "dsec/launcher/api/Router.h"
#include "dsec/launcher/api/StdinFeeds.h"
#include "dsec/launcher/node/Metrics.h"
#include "dsec/launcher/node/NodeAgent.h"
#include "dsec/launcher/node/RunCode.h"

namespace dsec::launcher {

struct ApiServerOptions {
  // The node-wide budget for buffered exec and call output (OutputBudget.h); 0: defaultOutputBudget() of the
  // node's memory.
  uint64_t output_budget_bytes = 0;
  // How long an exec or call waits for answers being written to give budget back before 429.
  double output_wait_seconds = 5;
  RunCodeOptions run_code;  // POST /run_code (RunCode.h)
};

class ApiServer : public RequestHandler {
 public:
  ApiServer(NodeAgent* agent, std::string token, const ApiServerOptions& options = {});
  void handle(HttpExchange& ex) override;
  void onResponse(int status) override { agent_->metrics().countHttpRequest(status); }
  bool acceptsCredentials(std::string_view authorization) const override;
  OutputBudget& outputBudget() { return output_budget_; }
  // POST /run_code, RunCodeApi.cc; also served by RunCodeListener without authentication.
  void runCode(HttpExchange& ex);

 private:
  // The routes by what they act on: the node, one sandbox, a session.
  void dispatch(HttpExchange& ex, const RouteMatch& m);
  void dispatchNode(HttpExchange& ex, const RouteMatch& m);
  void dispatchSandbox(HttpExchange& ex, const RouteMatch& m);
  void dispatchSession(HttpExchange& ex, const RouteMatch& m);
  // Snapshots, restores and forks (SnapshotRoutes.cc).
  void dispatchSnapshot(HttpExchange& ex, const RouteMatch& m);
  void restoreSandbox(HttpExchange& ex, const nlohmann::json& body);
  // DELETE files, GET files/list, GET files/stat.
  void fileOp(HttpExchange& ex, const RouteMatch& m);

  void createSandbox(HttpExchange& ex);
  void call(HttpExchange& ex);  // POST /v1/call, CallApi.cc
  void exec(HttpExchange& ex, const std::string& id, bool stream);
  // POST /v1/sandboxes/{id}/exec/{exec}/stdin (ExecRoute.cc).
  void execStdin(HttpExchange& ex, const std::string& id, const std::string& exec_id, bool eof);
  // POST .../exec/{exec}/signal {"signal": N}: to a running streamed exec that has an exec id (stdin_stream).
  void execSignal(HttpExchange& ex, const std::string& id, const std::string& exec_id);
  // GET /v1/sandboxes/{id}/terminal: a terminal session over WebSocket (TerminalRoute.cc).
  void terminal(HttpExchange& ex, const RouteMatch& m);
  void sandboxPolicy(HttpExchange& ex, const RouteMatch& m);  // network, protect, violations
  void readFile(HttpExchange& ex, const RouteMatch& m);
  void writeFile(HttpExchange& ex, const RouteMatch& m);
  void getTar(HttpExchange& ex, const RouteMatch& m);
  void putTar(HttpExchange& ex, const RouteMatch& m);
  void putTarViaFile(HttpExchange& ex, backends::Sandbox& sandbox, const std::string& path);

  void renderMetrics(std::string* out);
  nlohmann::json nodeInfo();

  NodeAgent* agent_;
  std::string token_;
  OutputBudget output_budget_;
  RunCodeOptions run_code_;
  StdinFeeds stdin_feeds_;
  HangUpWatch hangups_;  // streamed execs whose client went away
};

nlohmann::json execResultToJson(const backends::ExecResult& r);
nlohmann::json fileStatToJson(const backends::FileStat& st);
// Splits off an incomplete UTF-8 sequence at the end of `data` (kept for the next chunk of a stream).
size_t completeUtf8Prefix(std::string_view data);

}  // namespace dsec::launcher
