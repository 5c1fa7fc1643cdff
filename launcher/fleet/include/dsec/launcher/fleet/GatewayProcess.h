// The gateway process of a dsec-launch fleet (`dsec-launch --gateway-only --gateway-config FILE`): rank 0
// writes its settings to a file (JSON, mode 0600, in the fleet state dir next to fleet-token and
// fleet-nodes.json) and a supervisor runs it as a child, restarting it on the same port when it dies.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <string>
#include <thread>

#include "dsec/common/Result.h"
#include "dsec/launcher/api/E2bFront.h"
#include "dsec/launcher/api/HttpServer.h"

namespace dsec::launcher::fleet {

struct GatewayProcessConfig {
  std::string fleet_name;
  std::string token_file;  // the fleet token (mode 0600)
  std::string seed_file;   // fleet-nodes.json: the nodes the ranks exchanged ("" : none)
  std::string port_file;   // where the gateway writes its port once it serves ("" : nowhere)
  std::string address;     // listen address ("" : 0.0.0.0)
  int port = 0;            // 0: a free one (the supervisor keeps it across restarts)
  // Node liveness (GatewayOptions). There is no admission setting: the nodes admit, the gateway places with
  // what they report.
  double lost_after_seconds = 3.0;
  // The HTTP edge: the nodes' own settings. Its listen address is address:port above (`http.listen` is unused).
  HttpServerOptions http;
  // "ADDR:PORT": a second listener, without authentication, serving only POST /run_code (RunCodeListener.h;
  // docs/security.md). "" : none.
  std::string run_code_listen;
  // The E2B-compatible listener in front of the gateway (E2bFront.h, docs/e2b.md); off while e2b.listen is "".
  E2bOptions e2b;

  bool operator==(const GatewayProcessConfig&) const = default;
};

// config.http listening on address:port.
HttpServerOptions gatewayHttpOptions(const GatewayProcessConfig& config);

// Writes the config as JSON, atomically, mode 0600. readGatewayConfig refuses a missing file, bad JSON, a field
// of the wrong type, bad values and the admission ratios a gateway once had, naming the field.
Status writeGatewayConfig(const std::string& path, const GatewayProcessConfig& config);
Result<GatewayProcessConfig> readGatewayConfig(const std::string& path);

// The gateway process: serves the fleet API until SIGINT/SIGTERM. Returns the exit code.
int runGatewayProcess(const GatewayProcessConfig& config);

// Runs `<self> --gateway-only --fleet NAME --gateway-config FILE` (the fleet name on the command line names the
// process for ps) and restarts it when it dies, on the same port (rewriting the config), so the fleet file stays
// right.
class GatewaySupervisor {
 public:
  GatewaySupervisor(GatewayProcessConfig config, std::string config_path);
  ~GatewaySupervisor();
  GatewaySupervisor(const GatewaySupervisor&) = delete;
  GatewaySupervisor& operator=(const GatewaySupervisor&) = delete;

  // Starts the first gateway and waits (up to 10 s) for its port.
  Result<int> start();
  void stop();

 private:
  void loop();
  bool spawnOnce(pid_t parent);

  GatewayProcessConfig config_;
  std::string config_path_;
  std::atomic<int> port_{0};
  std::atomic<pid_t> pid_{0};
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace dsec::launcher::fleet
