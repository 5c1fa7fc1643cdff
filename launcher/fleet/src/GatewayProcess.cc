#include "dsec/launcher/fleet/GatewayProcess.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <vector>

#include "dsec/common/Endpoint.h"
#include "dsec/common/Logging.h"
#include "dsec/common/Strings.h"
#include "dsec/launcher/api/RunCodeListener.h"
#include "dsec/launcher/api/StopSignals.h"
#include "dsec/launcher/fleet/Gateway.h"

namespace dsec::launcher::fleet {
namespace {

using nlohmann::json;
constexpr const char* kLog = "launch";

bool finitePositive(double x) { return std::isfinite(x) && x > 0; }

Status checkConfig(const GatewayProcessConfig& c) {
  if (c.fleet_name.empty()) return Error::invalid("gateway config: fleet_name is empty");
  if (c.token_file.empty()) return Error::invalid("gateway config: token_file is empty");
  if (c.port < 0 || c.port > 65535) return Error::invalid("gateway config: port " + std::to_string(c.port));
  if (!finitePositive(c.lost_after_seconds)) return Error::invalid("gateway config: lost_after_seconds must be > 0");
  if (!c.run_code_listen.empty()) {
    if (auto address = parseListenAddress(c.run_code_listen); !address.ok()) {
      return Error::invalid("gateway config: run_code_listen: " + address.error().message());
    }
  }
  if (Status st = validateE2bOptions(c.e2b, "gateway-"); !st.ok())
    return Error::invalid("gateway config: " + st.error().message());
  return validateHttpServerOptions(gatewayHttpOptions(c));
}

template <typename T>
void field(const json& j, const char* key, T* out) {
  if (j.contains(key)) *out = j.at(key).get<T>();
}

}  // namespace

HttpServerOptions gatewayHttpOptions(const GatewayProcessConfig& c) {
  HttpServerOptions h = c.http;
  h.listen = Endpoint{c.address.empty() ? std::string("0.0.0.0") : c.address, c.port}.hostPort();
  return h;
}

Status writeGatewayConfig(const std::string& path, const GatewayProcessConfig& c) {
  json j = {{"fleet_name", c.fleet_name},
            {"token_file", c.token_file},
            {"seed_file", c.seed_file},
            {"port_file", c.port_file},
            {"address", c.address},
            {"port", c.port},
            {"lost_after_seconds", c.lost_after_seconds},
            {"max_connections", c.http.max_connections},
            {"max_client_connections", c.http.max_client_connections},
            {"client_queue_seconds", c.http.client_queue_seconds},
            {"header_timeout_seconds", c.http.header_timeout_seconds},
            {"body_timeout_seconds", c.http.body_timeout_seconds},
            {"body_min_rate", c.http.body_min_rate},
            {"idle_timeout_ms", c.http.idle_timeout_ms},
            {"header_limit", c.http.header_limit},
            {"run_code_listen", c.run_code_listen},
            {"e2b_listen", c.e2b.listen},
            {"e2b_templates", c.e2b.templates},
            {"e2b_default_image", c.e2b.default_image}};
  return writeFileAtomic(path, j.dump(2) + "\n", 0600);
}

Result<GatewayProcessConfig> readGatewayConfig(const std::string& path) {
  DSEC_ASSIGN_OR_RETURN(std::string text, readPrivateFile(path));
  json j = json::parse(text, nullptr, false);
  if (!j.is_object()) return Error::invalid("gateway config " + path + ": not a JSON object");
  for (const char* gone : {"cpu_overcommit", "memory_overcommit"}) {
    if (j.contains(gone)) {
      return Error::invalid("gateway config " + path + ": " + gone +
                            " is refused: admission is each node's (its density controller's ratios), the gateway "
                            "places with what the nodes report");
    }
  }
  GatewayProcessConfig c;
  const char* key = "";
  try {
    auto get = [&](const char* k, auto* out) {
      key = k;
      field(j, k, out);
    };
    get("fleet_name", &c.fleet_name);
    get("token_file", &c.token_file);
    get("seed_file", &c.seed_file);
    get("port_file", &c.port_file);
    get("address", &c.address);
    get("port", &c.port);
    get("lost_after_seconds", &c.lost_after_seconds);
    get("max_connections", &c.http.max_connections);
    get("max_client_connections", &c.http.max_client_connections);
    get("client_queue_seconds", &c.http.client_queue_seconds);
    get("header_timeout_seconds", &c.http.header_timeout_seconds);
    get("body_timeout_seconds", &c.http.body_timeout_seconds);
    get("body_min_rate", &c.http.body_min_rate);
    get("idle_timeout_ms", &c.http.idle_timeout_ms);
    get("header_limit", &c.http.header_limit);
    get("run_code_listen", &c.run_code_listen);
    get("e2b_listen", &c.e2b.listen);
    get("e2b_templates", &c.e2b.templates);
    get("e2b_default_image", &c.e2b.default_image);
  } catch (const json::exception& e) {
    return Error::invalid("gateway config " + path + ": field " + key + ": " + e.what());
  }
  if (auto st = checkConfig(c); !st.ok()) return Error::invalid(path + ": " + st.error().message());
  return c;
}

int runGatewayProcess(const GatewayProcessConfig& config) {
  auto token = readPrivateFile(config.token_file);
  if (!token.ok()) {
    DSEC_LOG(kError, kLog) << "reading the token: " << token.error().message();
    return 1;
  }
  GatewayOptions go;
  go.fleet_name = config.fleet_name;
  go.token = trim(*token);
  go.lost_after_seconds = config.lost_after_seconds;
  Gateway gateway(go);
  if (!config.seed_file.empty()) {
    auto seed = readPrivateFile(config.seed_file);
    if (!seed.ok()) {
      // The nodes register themselves within a heartbeat anyway: the gateway starts without them.
      DSEC_LOG(kWarn, kLog) << "reading the fleet's nodes: " << seed.error().message();
    } else if (auto j = json::parse(*seed, nullptr, false); j.is_object() && j.contains("nodes")) {
      for (const auto& n : j["nodes"]) {
        if (auto spec = parseNodeSpec(n); spec.ok()) (void)gateway.registerNode(*spec, true);
      }
    }
  }
  (void)installStopSignals();
  auto server = HttpServer::start(gatewayHttpOptions(config), &gateway);
  if (!server.ok()) {
    DSEC_LOG(kError, kLog) << "gateway: " << server.error().message();
    return 1;
  }
  std::unique_ptr<RunCodeListener> run_code_handler;
  std::unique_ptr<HttpServer> run_code_server;
  if (!config.run_code_listen.empty()) {
    HttpServerOptions open = gatewayHttpOptions(config);
    open.listen = config.run_code_listen;
    run_code_handler = std::make_unique<RunCodeListener>([&gateway](HttpExchange& ex) { gateway.runCode(ex); },
                                                         [&gateway](int status) { gateway.onResponse(status); });
    auto listener = HttpServer::start(open, run_code_handler.get());
    if (!listener.ok()) {
      DSEC_LOG(kError, kLog) << "gateway: --gateway-run-code-listen " << config.run_code_listen << ": "
                             << listener.error().message();
      (*server)->stop();
      return 1;
    }
    run_code_server = std::move(*listener);
    DSEC_LOG(kWarn, kLog) << "gateway: POST /run_code without authentication on " << run_code_server->endpoint()
                          << " (anyone who reaches it can run code in the fleet; docs/security.md)";
  }
  std::unique_ptr<E2bFront> e2b_handler;
  std::unique_ptr<HttpServer> e2b_server;
  if (!config.e2b.listen.empty()) {
    HttpServerOptions e2b = gatewayHttpOptions(config);
    e2b.listen = config.e2b.listen;
    // A translator in front of the gateway's own API: placement, failover and lost nodes as for any client.
    e2b_handler = std::make_unique<E2bFront>(config.e2b, (*server)->endpoint(), go.token);
    auto listener = HttpServer::start(e2b, e2b_handler.get());
    if (!listener.ok()) {
      DSEC_LOG(kError, kLog) << "gateway: --gateway-e2b-listen " << config.e2b.listen << ": "
                             << listener.error().message();
      if (run_code_server) run_code_server->stop();
      (*server)->stop();
      return 1;
    }
    e2b_server = std::move(*listener);
    DSEC_LOG(kInfo, kLog) << "gateway: E2B-compatible API on " << e2b_server->endpoint();
  }
  gateway.start();
  if (!config.port_file.empty()) (void)writeFileAtomic(config.port_file, std::to_string((*server)->port()), 0600);
  DSEC_LOG(kInfo, kLog) << "gateway of fleet " << config.fleet_name << " on port " << (*server)->port();
  while (waitForStopSignal(-1) == 0) {
  }
  if (e2b_server) e2b_server->stop();
  if (run_code_server) run_code_server->stop();
  (*server)->stop();
  gateway.stop();
  return 0;
}

GatewaySupervisor::GatewaySupervisor(GatewayProcessConfig config, std::string config_path)
    : config_(std::move(config)), config_path_(std::move(config_path)) {}

GatewaySupervisor::~GatewaySupervisor() { stop(); }

Result<int> GatewaySupervisor::start() {
  port_ = config_.port;
  ::unlink(config_.port_file.c_str());
  thread_ = std::thread([this] { loop(); });
  for (int i = 0; i < 200; ++i) {
    if (auto text = readFile(config_.port_file); text.ok() && !trim(*text).empty()) {
      port_ = std::stoi(trim(*text));
      return port_.load();
    }
    ::usleep(50 * 1000);
  }
  return Error(ErrorCode::kTimeout, "the gateway did not start within 10 s");
}

void GatewaySupervisor::stop() {
  stopping_ = true;
  pid_t pid = pid_.load();
  if (pid > 0) ::kill(pid, SIGTERM);
  if (thread_.joinable()) thread_.join();
}

// One gateway process, from fork to its end; false if it could not be started.
bool GatewaySupervisor::spawnOnce(pid_t parent) {
  GatewayProcessConfig config = config_;
  config.port = port_.load();
  if (auto st = writeGatewayConfig(config_path_, config); !st.ok()) {
    DSEC_LOG(kError, kLog) << "writing the gateway config: " << st.error().message();
    return false;
  }
  std::vector<std::string> argv = {"dsec-launch",     "--gateway-only",   "--fleet",
                                   config.fleet_name, "--gateway-config", config_path_};
  std::vector<char*> cargv;
  for (auto& s : argv) cargv.push_back(s.data());
  cargv.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(1);
    // Nothing of the rank but stdio: MPI's (PMIx) descriptors would tie the gateway to the step's PMIx server.
    ::close_range(3, ~0U, 0);
    ::execv("/proc/self/exe", cargv.data());
    ::_exit(127);
  }
  if (pid < 0) return false;
  pid_ = pid;
  if (stopping_) ::kill(pid, SIGTERM);  // stop() ran between the fork and pid_: it could not signal this one
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  pid_ = 0;
  if (!stopping_) {
    DSEC_LOG(kWarn, kLog) << "gateway process " << pid << " ended ("
                          << (WIFSIGNALED(status) ? std::string("signal ") + strsignal(WTERMSIG(status))
                                                  : "exit " + std::to_string(WEXITSTATUS(status)))
                          << "): restarting it on port " << port_.load();
  }
  return true;
}

void GatewaySupervisor::loop() {
  // The child gets SIGTERM when this thread's process dies (PR_SET_PDEATHSIG follows the forking thread, which
  // lives as long as the supervisor).
  pid_t parent = ::getpid();
  while (!stopping_) {
    if (!spawnOnce(parent)) {
      ::sleep(1);
      continue;
    }
    if (stopping_) break;
    ::usleep(200 * 1000);
  }
}

}  // namespace dsec::launcher::fleet
