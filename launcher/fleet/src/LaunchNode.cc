#include "dsec/launcher/fleet/LaunchNode.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <vector>

#include "dsec/common/Endpoint.h"
#include "dsec/common/Fd.h"
#include "dsec/common/Logging.h"
#include "dsec/common/Strings.h"
#include "dsec/launcher/api/Credentials.h"
#include "dsec/launcher/api/StopSignals.h"
#include "dsec/launcher/node/NodeName.h"
#include "dsec/placement/NodeModel.h"

namespace dsec::launcher::fleet {
namespace {

using nlohmann::json;
constexpr const char* kLog = "launch";

// The local address the kernel would use to reach `peer` (a UDP connect sends nothing).
std::string addressTowards(const std::string& peer) {
  struct addrinfo hints {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  struct addrinfo* res = nullptr;
  if (::getaddrinfo(peer.c_str(), "9", &hints, &res) != 0) return "";
  std::unique_ptr<struct addrinfo, decltype(&::freeaddrinfo)> guard(res, ::freeaddrinfo);
  UniqueFd fd(::socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!fd || ::connect(fd.get(), res->ai_addr, res->ai_addrlen) != 0) return "";
  struct sockaddr_storage ss {};
  socklen_t len = sizeof(ss);
  if (::getsockname(fd.get(), reinterpret_cast<struct sockaddr*>(&ss), &len) != 0) return "";
  char buf[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family != AF_INET) return "";  // IPv6 endpoints would need brackets everywhere; the fleet uses IPv4
  ::inet_ntop(AF_INET, &reinterpret_cast<struct sockaddr_in*>(&ss)->sin_addr, buf, sizeof(buf));
  return buf;
}

std::string firstInterfaceAddress() {
  struct ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) != 0) return "";
  std::string out;
  for (auto* i = ifs; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || (i->ifa_flags & IFF_LOOPBACK)) continue;
    char buf[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &reinterpret_cast<struct sockaddr_in*>(i->ifa_addr)->sin_addr, buf, sizeof(buf));
    out = buf;
    break;
  }
  ::freeifaddrs(ifs);
  return out;
}

// The node's own directory: its token, sandbox state and layer mounts, with `layers` pointing at the shared
// store, so nodes sharing one store (a shared file system) never adopt or reap each other's sandboxes.
Result<std::string> prepareStateDir(const LaunchOptions& options, const std::string& node, const std::string& token) {
  const std::string& root = options.serve.node.root;
  std::string dir = fleetStateDir(options, node);
  DSEC_TRY(makeDirs(root + "/layers", 0755));
  // Its token and the sandboxes' records (their env) live here: a directory someone else made is not used.
  DSEC_TRY(makePrivateDir(dir));
  std::string link = dir + "/layers";
  struct stat st {};
  if (::lstat(link.c_str(), &st) != 0) {
    std::string target = root + "/layers";
    if (target[0] != '/') {
      char cwd[4096];
      if (::getcwd(cwd, sizeof(cwd))) target = std::string(cwd) + "/" + target;
    }
    if (::symlink(target.c_str(), link.c_str()) != 0 && errno != EEXIST) return Error::sys(errno, "symlink " + link);
  }
  DSEC_TRY(writeFileAtomic(dir + "/token", token, 0600));
  return dir;
}

}  // namespace

std::string safeNodeName(const std::string& given) {
  std::string raw = given;
  if (raw.empty()) {
    const char* slurm = std::getenv("SLURMD_NODENAME");
    if (slurm && *slurm) {
      raw = slurm;
    } else {
      char host[256] = {};
      ::gethostname(host, sizeof(host) - 1);
      raw = host;
      raw = raw.substr(0, raw.find('.'));
    }
  }
  return nodeNameFrom(raw);
}

std::string advertisedAddress(const LaunchOptions& options, const std::string& peer) {
  if (!options.address.empty()) return options.address;
  std::vector<std::string> peers;
  if (!peer.empty()) peers.push_back(peer);
  if (const char* p = std::getenv("DSEC_ROUTE_TO")) peers.push_back(p);
  if (const char* p = std::getenv("SLURM_LAUNCH_NODE_IPADDR")) peers.push_back(p);
  for (const auto& p : peers) {
    std::string a = addressTowards(p);
    if (!a.empty() && a != "0.0.0.0") return a;
  }
  std::string a = firstInterfaceAddress();
  return a.empty() ? "127.0.0.1" : a;
}

NodeCapacity nodeCapacity() {
  NodeCapacity c;
  if (auto model = placement::NodeModel::fromSystem(); model.ok()) {
    auto s = model->summary();
    c.cpus = s.pus;
    c.memory_bytes = s.memory_bytes;
  }
  if (c.cpus <= 0) c.cpus = static_cast<double>(::sysconf(_SC_NPROCESSORS_ONLN));
  if (c.memory_bytes <= 0) c.memory_bytes = static_cast<int64_t>(::sysconf(_SC_PHYS_PAGES)) * ::sysconf(_SC_PAGESIZE);
  return c;
}

std::string fleetStateDir(const LaunchOptions& options, const std::string& node) {
  return options.state_dir.empty() ? options.serve.node.root + "/nodes/" + node : options.state_dir;
}

Result<RunningNode> startLaunchNode(const LaunchOptions& options, const std::string& token, const std::string& peer) {
  RunningNode r;
  r.name = safeNodeName(options.node_name);
  r.capacity = nodeCapacity();
  ServeOptions serve = options.serve;  // every node flag, as given
  // Snapshots are the fleet's, in <fleet root>/snapshots (unless --snapshot-dir says otherwise): a snapshot taken on
  // one node is restored on any other that shares the root.
  if (serve.node.snapshot_dir.empty()) serve.node.snapshot_dir = options.serve.node.root + "/snapshots";
  DSEC_ASSIGN_OR_RETURN(serve.node.root, prepareStateDir(options, r.name, token));
  serve.node.node_name = r.name;
  serve.http.listen = Endpoint{advertisedAddress(options, peer), options.node_port}.hostPort();
  serve.write_fleet_file = false;
  DSEC_ASSIGN_OR_RETURN(r.node, EmbeddedNode::start(serve));
  r.endpoint = r.node->endpoint();
  return r;
}

RegistrarOptions registrarOptions(const std::vector<std::string>& gateways, const std::string& token,
                                  const RunningNode& node) {
  return {gateways, token, node.name, node.endpoint, node.capacity.cpus, node.capacity.memory_bytes, 1.0};
}

std::vector<std::string> fleetFileGateways(const json& fleetfile) {
  std::vector<std::string> out;
  if (fleetfile.contains("endpoints") && fleetfile["endpoints"].is_array()) {
    for (const auto& e : fleetfile["endpoints"]) {
      if (e.is_string() && !e.get<std::string>().empty()) out.push_back(e.get<std::string>());
    }
  }
  if (out.empty() && fleetfile.contains("endpoint") && fleetfile["endpoint"].is_string()) {
    out.push_back(fleetfile["endpoint"].get<std::string>());
  }
  return out;
}

void runUntilStopped(RunningNode& node, NodeRegistrar& registrar) {
  bool deregistered = false;
  while (waitForStopSignal(1000) == 0) {
    // An operator drained the node at the gateway: once empty it leaves the fleet (the job keeps running until
    // it is cancelled).
    if (!deregistered && registrar.drainRequested()) {
      int64_t left = registrar.drain(0);
      if (left == 0) {
        registrar.deregister();
        deregistered = true;
        DSEC_LOG(kInfo, kLog) << "node " << node.name << " drained and left the fleet";
      }
    }
  }
}

int runJoin(const LaunchOptions& options) {
  const std::string& fleet_name = options.join;
  auto text = readFile(fleetFilePath(fleet_name));
  if (!text.ok()) {
    DSEC_LOG(kError, kLog) << "--join " << fleet_name << ": " << text.error().message();
    return 1;
  }
  auto fleetfile = json::parse(*text, nullptr, false);
  // Every gateway candidate (a fleet that lost rank 0 still has the others); the first names the address to
  // advertise towards.
  std::vector<std::string> gateways = fleetfile.is_object() ? fleetFileGateways(fleetfile) : std::vector<std::string>{};
  if (gateways.empty() || !fleetfile.contains("token") || !fleetfile["token"].is_string()) {
    DSEC_LOG(kError, kLog) << "--join " << fleet_name << ": " << fleetFilePath(fleet_name) << " has no endpoint/token";
    return 1;
  }
  std::string token = fleetfile["token"].get<std::string>();
  auto ep = parseEndpoint(gateways.front());
  if (!ep.ok()) {
    DSEC_LOG(kError, kLog) << ep.error().message();
    return 1;
  }
  (void)installStopSignals();
  LaunchOptions joining = options;
  // The fleet's job still runs (its gateway answers): sandboxes it left on this node directory (a rank that
  // died) are taken over, and this job's epilog destroys them; those of any other job are reaped.
  std::string fleet_job = fleetfile.value("slurm_job", "");
  if (!fleet_job.empty() && fleet_job != joining.serve.node.slurm_job) {
    joining.serve.node.adopt_jobs.push_back(fleet_job);
  }
  // The fleet's gateways are out of every sandbox's reach here, whatever its egress policy.
  for (const auto& g : gateways) {
    auto gateway = parseEndpoint(g);
    in_addr parsed{};
    if (gateway.ok() && inet_pton(AF_INET, gateway->host.c_str(), &parsed) == 1) {
      joining.serve.node.egress_never.push_back(gateway->host);
    }
  }
  auto node = startLaunchNode(joining, token, ep->host);
  if (!node.ok()) {
    DSEC_LOG(kError, kLog) << "starting the node: " << node.error().message();
    return 1;
  }
  NodeRegistrar registrar(registrarOptions(gateways, token, *node));
  if (auto st = registrar.registerOnce(); !st.ok()) {
    DSEC_LOG(kError, kLog) << "joining fleet " << fleet_name << ": " << st.error().message();
    node->node->stop(true);
    return 1;
  }
  registrar.start();
  DSEC_LOG(kInfo, kLog) << "node " << node->name << " at " << node->endpoint << " joined fleet " << fleet_name;
  runUntilStopped(*node, registrar);
  // Leaving: drain first (no new sandboxes; running ones get drain_timeout to finish), then go.
  int64_t left = registrar.drain(options.drain_timeout);
  if (left > 0) DSEC_LOG(kWarn, kLog) << left << " sandboxes still running after the drain timeout: destroying them";
  registrar.deregister();
  node->node->stop(true);
  return 0;
}

}  // namespace dsec::launcher::fleet
