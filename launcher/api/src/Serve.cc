#include "dsec/launcher/api/Serve.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <mutex>

#include "dsec/common/Logging.h"
#include "dsec/common/Strings.h"
#include "dsec/launcher/api/ApiServer.h"
#include "dsec/launcher/api/Credentials.h"
#include "dsec/launcher/api/HttpServer.h"
#include "dsec/launcher/api/HttpStore.h"
#include "dsec/launcher/api/RunCodeListener.h"
#include "dsec/launcher/api/StopSignals.h"
#include "dsec/launcher/node/Metrics.h"
#include "dsec/launcher/node/NodeAgent.h"
#include "dsec/launcher/node/NodeName.h"

namespace dsec::launcher {
namespace {

constexpr const char* kLog = "serve";

void noopSignal(int) {}

// A caught (not ignored) SIGPIPE: writes to a closed pipe or socket return EPIPE instead of killing the
// node, and, unlike SIG_IGN, the disposition resets to default in every program the backend execs.
void installSigpipeHandler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_handler = noopSignal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGPIPE, &sa, nullptr);
  });
}

class EmbeddedNodeImpl : public EmbeddedNode {
 public:
  explicit EmbeddedNodeImpl(const ServeOptions& options) : options_(options) {}
  ~EmbeddedNodeImpl() override { stop(false); }

  Status init() {
    installSigpipeHandler();
    NodeOptions node = options_.node;
    DSEC_TRY(validateNodeName(node.node_name));
    if (options_.write_fleet_file) DSEC_TRY(validateFleetName(node.fleet_name));
    if (node.root.empty()) return Error::invalid("the node's root is empty");
    if (node.max_sandboxes <= 0) return Error::invalid("max_sandboxes must be positive");
    DSEC_TRY(validateHttpServerOptions(options_.http));
    if (options_.output_budget_bytes != 0 && options_.output_budget_bytes < kMinOutputBudget) {
      return Error::invalid("the output budget must be at least " + std::to_string(kMinOutputBudget) + " bytes");
    }
    if (auto st = makeDirs(node.root, 0755); !st.ok()) return st.error().wrap("creating root " + node.root);
    DSEC_ASSIGN_OR_RETURN(token_, loadOrCreateToken(node.root));
    if (fs3::isHttpStore(node.store_dir) && node.shared_store == nullptr) {
      DSEC_ASSIGN_OR_RETURN(node.shared_store, openSharedStore(node.store_dir));  // the core speaks no HTTP
    }
    DSEC_ASSIGN_OR_RETURN(agent_, NodeAgent::start(node, &metrics_));
    metrics_.setGaugeRenderer([agent = agent_.get()](std::string* out) { agent->renderGauges(out); });
    ApiServerOptions api_options;
    api_options.output_budget_bytes = options_.output_budget_bytes;
    api_options.run_code = options_.run_code;
    api_ = std::make_unique<ApiServer>(agent_.get(), token_, api_options);
    auto server = HttpServer::start(options_.http, api_.get());
    if (!server.ok()) {
      agent_->shutdown(false);
      return server.error();
    }
    http_ = std::move(*server);
    if (!options_.run_code_listen.empty()) {
      HttpServerOptions open = options_.http;
      open.listen = options_.run_code_listen;
      ApiServer* api = api_.get();
      run_code_handler_ = std::make_unique<RunCodeListener>([api](HttpExchange& ex) { api->runCode(ex); },
                                                            [api](int status) { api->onResponse(status); });
      auto listener = HttpServer::start(open, run_code_handler_.get());
      if (!listener.ok()) {
        http_->stop();
        agent_->shutdown(false);
        return listener.error().wrap("--run-code-listen " + options_.run_code_listen);
      }
      run_code_http_ = std::move(*listener);
      DSEC_LOG(kWarn, kLog) << "POST /run_code without authentication on " << run_code_http_->endpoint()
                            << " (anyone who reaches it can run code here; docs/security.md)";
    }
    if (!options_.e2b.listen.empty()) {
      HttpServerOptions e2b = options_.http;
      e2b.listen = options_.e2b.listen;
      e2b_handler_ = std::make_unique<E2bFront>(options_.e2b, http_->endpoint(), token_);
      auto listener = HttpServer::start(e2b, e2b_handler_.get());
      if (!listener.ok()) {
        if (run_code_http_) run_code_http_->stop();
        http_->stop();
        agent_->shutdown(false);
        return listener.error().wrap("--e2b-listen " + options_.e2b.listen);
      }
      e2b_http_ = std::move(*listener);
      DSEC_LOG(kInfo, kLog) << "E2B-compatible API on " << e2b_http_->endpoint()
                            << " (E2B_API_URL and E2B_SANDBOX_URL; E2B_API_KEY is the node's token)";
    }
    if (options_.write_fleet_file) {
      const NodeOptions& node = options_.node;
      auto st = writeFleetFile(node.fleet_name, {http_->endpoint()}, token_, node.node_name, node.root, node.slurm_job);
      if (!st.ok()) {
        http_->stop();
        agent_->shutdown(false);
        return st.error().wrap("writing the fleet file");
      }
    }
    DSEC_LOG(kInfo, kLog) << "node " << options_.node.node_name << " of fleet " << options_.node.fleet_name
                          << " serving on " << http_->endpoint() << " (root " << options_.node.root << ")";
    return okStatus();
  }

  std::string endpoint() const override { return http_ ? http_->endpoint() : ""; }
  std::string token() const override { return token_; }
  std::string e2bEndpoint() const override { return e2b_http_ ? e2b_http_->endpoint() : ""; }

  void stop(bool destroy_sandboxes) override {
    std::lock_guard lock(stop_mu_);
    if (stopped_) return;
    stopped_ = true;
    std::string endpoint = this->endpoint();
    if (e2b_http_) e2b_http_->stop();
    if (run_code_http_) run_code_http_->stop();
    if (http_) http_->stop();
    if (agent_) agent_->shutdown(destroy_sandboxes);
    metrics_.setGaugeRenderer(nullptr);
    if (options_.write_fleet_file && !endpoint.empty()) removeFleetFileIfOurs(options_.node.fleet_name, endpoint);
    DSEC_LOG(kInfo, kLog) << "node " << options_.node.node_name << " stopped"
                          << (destroy_sandboxes ? " (sandboxes destroyed)" : " (sandboxes left for re-adoption)");
  }

 private:
  ServeOptions options_;
  Metrics metrics_;
  std::string token_;
  std::unique_ptr<NodeAgent> agent_;
  std::unique_ptr<ApiServer> api_;
  std::unique_ptr<HttpServer> http_;
  std::unique_ptr<RunCodeListener> run_code_handler_;
  std::unique_ptr<HttpServer> run_code_http_;  // --run-code-listen; stopped before the handler goes
  std::unique_ptr<E2bFront> e2b_handler_;
  std::unique_ptr<HttpServer> e2b_http_;  // --e2b-listen; stopped before the handler goes
  std::mutex stop_mu_;
  bool stopped_ = false;
};

}  // namespace

HttpServerOptions defaultServeHttpOptions() {
  HttpServerOptions http;
  http.listen = "127.0.0.1:8470";
  return http;
}

Result<std::unique_ptr<EmbeddedNode>> EmbeddedNode::start(const ServeOptions& options) {
  // The node holds its token in memory: nothing but host root may read it through /proc or ptrace, and no core
  // dump carries it.
  if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) return Error::sys(errno, "make the node process undumpable");
  auto node = std::make_unique<EmbeddedNodeImpl>(options);
  DSEC_TRY(node->init());
  return std::unique_ptr<EmbeddedNode>(std::move(node));
}

Status serveUntilSignal(const ServeOptions& options) {
  DSEC_TRY(installStopSignals());
  auto node = EmbeddedNode::start(options);
  if (!node.ok()) {
    restoreStopSignals();
    return node.error();
  }
  int sig = 0;
  while (sig == 0) sig = waitForStopSignal(-1);
  DSEC_LOG(kInfo, kLog) << "got " << strsignal(sig) << ", stopping (sandboxes keep running)";
  // A second signal while stopping falls back to the default action, so an operator can still force it.
  restoreStopSignals();
  (*node)->stop(false);
  return okStatus();
}

}  // namespace dsec::launcher
