// dsec-launch: one rank per node (srun --mpi=pmix, or mpirun). MPI only coordinates the start: rank 0 makes
// the fleet token, every rank starts its node agent, the ranks exchange endpoints and capacity once, and rank 0
// starts the gateway (a supervised child process, restarted if it dies) and writes the fleet file. From then on
// the ranks talk HTTP only, so a dead rank does not take the others down. `--join NAME` adds this job's nodes
// to a running fleet (no MPI); `--gateway-only` is the gateway process itself. See docs/fleet.md.
#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <mpi.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "dsec/common/Logging.h"
#include "dsec/common/Strings.h"
#include "dsec/launcher/api/Credentials.h"
#include "dsec/launcher/fleet/Fleet.h"
#include "dsec/launcher/fleet/Gateway.h"
#include "dsec/launcher/api/HttpServer.h"
#include "dsec/launcher/api/Serve.h"
#include "dsec/launcher/api/StopSignals.h"
#include "dsec/placement/NodeModel.h"

namespace {

using namespace dsec;
using namespace dsec::launcher;
using nlohmann::json;
constexpr const char* kLog = "launch";
constexpr int kBlob = 1024;

struct Args {
  std::string fleet;
  std::string root;
  std::string state_dir;  // per-node: token, state, layer mounts (default <root>/nodes/<node>)
  int port = 0;           // gateway port (0: a free one, kept across gateway restarts)
  int node_port = 0;
  std::string join;
  bool gateway_only = false;
  bool no_mpi = false;
  std::string token_file, seed_file, port_file;
  std::string address;  // advertised address (default: the interface that routes to srun's host)
  std::string node_name;
  int64_t max_sandboxes = 4096;
  std::string fncall_image;  // default image of POST /v1/call ("" = the node default)
  double cpu_overcommit = 8.0;
  double memory_overcommit = 1.0;
  double drain_timeout = 30;
  double lost_after = 3.0;
  bool simulate = false;        // simulated node agents (no sandbox processes; docs/fleet.md)
  bool user_namespaces = true;  // false: the operator's opt-out (NodeOptions::user_namespaces)
  // The HTTP edge of the node and of the gateway (docs/node-agent.md, "Connection budgets"); defaults as
  // HttpServerOptions. The output budget is the node's (0: its default).
  int max_connections = 1024;
  int max_client_connections = 0;
  double header_timeout = 10;
  double body_timeout = 10;
  double body_min_rate = 64 * 1024;
  uint64_t output_budget = 0;
};

[[noreturn]] void usage(int code) {
  std::cerr << "usage: dsec-launch [--fleet NAME] [--root DIR] [--state-dir DIR] [--port N] [--node-port N]\n"
               "                   [--address ADDR] [--node-name NAME] [--max-sandboxes N] [--cpu-overcommit X]\n"
               "                   [--memory-overcommit X] [--lost-after SECONDS] [--fncall-image IMAGE] [--no-mpi]\n"
               "                   [--simulate] [--user-namespaces on|off] [--max-connections N]\n"
               "                   [--max-client-connections N] [--header-timeout SECONDS] [--body-timeout SECONDS]\n"
               "                   [--body-min-rate SIZE] [--output-budget SIZE]\n"
               "       dsec-launch --join NAME [--root DIR] [--drain-timeout SECONDS] ...\n"
               "       dsec-launch --gateway-only --fleet NAME --token-file F [--seed F] [--port N] [--port-file F]\n"
               "Defaults: --fleet $DSEC_FLEET or rollout; --root $DSEC_ROOT or /var/lib/dsec.\n";
  std::exit(code);
}

Args parseArgs(int argc, char** argv) {
  Args a;
  const char* env_fleet = std::getenv("DSEC_FLEET");
  const char* env_root = std::getenv("DSEC_ROOT");
  a.fleet = env_fleet && *env_fleet ? env_fleet : "rollout";
  a.root = env_root && *env_root ? env_root : "/var/lib/dsec";
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << "dsec-launch: " << k << " needs a value\n";
        usage(2);
      }
      return argv[++i];
    };
    auto number = [&](double lo) {
      std::string v = value();
      char* end = nullptr;
      double d = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0' || d < lo) {
        std::cerr << "dsec-launch: bad value '" << v << "' for " << k << "\n";
        usage(2);
      }
      return d;
    };
    auto size = [&](int64_t lo) {
      std::string v = value();
      auto bytes = parseByteSize(v);
      if (!bytes.ok() || *bytes < lo) {
        std::cerr << "dsec-launch: bad value '" << v << "' for " << k << " (at least " << lo << " bytes)\n";
        usage(2);
      }
      return *bytes;
    };
    if (k == "--fleet")
      a.fleet = value();
    else if (k == "--root")
      a.root = value();
    else if (k == "--state-dir")
      a.state_dir = value();
    else if (k == "--port")
      a.port = static_cast<int>(number(0));
    else if (k == "--node-port")
      a.node_port = static_cast<int>(number(0));
    else if (k == "--join")
      a.join = value();
    else if (k == "--gateway-only")
      a.gateway_only = true;
    else if (k == "--no-mpi")
      a.no_mpi = true;
    else if (k == "--simulate")
      a.simulate = true;
    else if (k == "--user-namespaces") {
      std::string v = value();
      if (v != "on" && v != "off") {
        std::cerr << "dsec-launch: --user-namespaces wants on or off\n";
        usage(2);
      }
      a.user_namespaces = v == "on";
    } else if (k == "--token-file")
      a.token_file = value();
    else if (k == "--seed")
      a.seed_file = value();
    else if (k == "--port-file")
      a.port_file = value();
    else if (k == "--address")
      a.address = value();
    else if (k == "--node-name")
      a.node_name = value();
    else if (k == "--max-sandboxes")
      a.max_sandboxes = static_cast<int64_t>(number(1));
    else if (k == "--fncall-image")
      a.fncall_image = value();
    else if (k == "--cpu-overcommit")
      a.cpu_overcommit = number(0.01);
    else if (k == "--memory-overcommit")
      a.memory_overcommit = number(0.01);
    else if (k == "--drain-timeout")
      a.drain_timeout = number(0);
    else if (k == "--lost-after")
      a.lost_after = number(0.5);
    else if (k == "--max-connections")
      a.max_connections = static_cast<int>(number(1));
    else if (k == "--max-client-connections")
      a.max_client_connections = static_cast<int>(number(0));
    else if (k == "--header-timeout")
      a.header_timeout = number(0.001);
    else if (k == "--body-timeout")
      a.body_timeout = number(0.001);
    else if (k == "--body-min-rate")
      a.body_min_rate = static_cast<double>(size(1));
    else if (k == "--output-budget")
      a.output_budget = static_cast<uint64_t>(size(1 << 20));
    else if (k == "-h" || k == "--help")
      usage(0);
    else {
      std::cerr << "dsec-launch: unknown argument '" << k << "'\n";
      usage(2);
    }
  }
  if (!a.join.empty()) a.fleet = a.join;
  if (a.port > 65535 || a.node_port > 65535) usage(2);
  return a;
}

// ---- signals ------------------------------------------------------------------------------------------

// Waits up to timeout_ms for a stop signal; true if one came.
bool waitForStop(int timeout_ms) { return waitForStopSignal(timeout_ms) != 0; }

// ---- node identity ------------------------------------------------------------------------------------

// Slurm's node name (or the host name) made safe for sandbox ids: [a-z0-9-], at most 32.
std::string nodeName(const std::string& given) {
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
  std::string out;
  for (char c : raw) {
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    out.push_back((std::isalnum(static_cast<unsigned char>(c))) ? c : '-');
  }
  while (!out.empty() && out[0] == '-') out.erase(0, 1);
  if (out.size() > 32) out.resize(32);
  return out.empty() ? "node" : out;
}

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
  if (ss.ss_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<struct sockaddr_in*>(&ss)->sin_addr, buf, sizeof(buf));
  } else {
    return "";  // IPv6 endpoints would need brackets everywhere; the fleet uses IPv4
  }
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

// Where other nodes reach this one: --address; else the interface that routes to `peer` (the gateway, or
// srun's host); else the first non-loopback interface.
std::string advertisedAddress(const Args& args, const std::string& peer) {
  if (!args.address.empty()) return args.address;
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

struct Capacity {
  double cpus = 0;
  int64_t memory_bytes = 0;
};
Capacity nodeCapacity() {
  Capacity c;
  if (auto model = placement::NodeModel::fromSystem(); model.ok()) {
    auto s = model->summary();
    c.cpus = s.pus;
    c.memory_bytes = s.memory_bytes;
  }
  if (c.cpus <= 0) c.cpus = static_cast<double>(::sysconf(_SC_NPROCESSORS_ONLN));
  if (c.memory_bytes <= 0) c.memory_bytes = static_cast<int64_t>(::sysconf(_SC_PHYS_PAGES)) * ::sysconf(_SC_PAGESIZE);
  return c;
}

// ---- the node -----------------------------------------------------------------------------------------

// The node's own directory: its token, sandbox state and layer mounts, with `layers` pointing at the shared
// store, so nodes sharing one store (a shared file system) never adopt or reap each other's sandboxes.
Result<std::string> prepareStateDir(const Args& args, const std::string& node, const std::string& token) {
  std::string dir = args.state_dir.empty() ? args.root + "/nodes/" + node : args.state_dir;
  DSEC_TRY(makeDirs(args.root + "/layers", 0755));
  DSEC_TRY(makeDirs(dir, 0700));
  std::string link = dir + "/layers";
  struct stat st {};
  if (::lstat(link.c_str(), &st) != 0) {
    std::string target = args.root + "/layers";
    if (target[0] != '/') {
      char cwd[4096];
      if (::getcwd(cwd, sizeof(cwd))) target = std::string(cwd) + "/" + target;
    }
    if (::symlink(target.c_str(), link.c_str()) != 0 && errno != EEXIST) return Error::sys(errno, "symlink " + link);
  }
  DSEC_TRY(writeFileAtomic(dir + "/token", token, 0600));
  return dir;
}

struct RunningNode {
  std::unique_ptr<EmbeddedNode> node;
  std::string name;
  std::string endpoint;
  Capacity capacity;
};

Result<RunningNode> startNode(const Args& args, const std::string& token, const std::string& peer) {
  RunningNode r;
  r.name = nodeName(args.node_name);
  r.capacity = nodeCapacity();
  DSEC_ASSIGN_OR_RETURN(auto dir, prepareStateDir(args, r.name, token));
  std::string address = advertisedAddress(args, peer);
  ServeOptions o;
  o.node.root = dir;
  o.http.listen = address + ":" + std::to_string(args.node_port);
  o.node.fleet_name = args.fleet;
  o.node.node_name = r.name;
  o.write_fleet_file = false;
  o.node.max_sandboxes = args.max_sandboxes;
  if (!args.fncall_image.empty()) o.node.fncall.image = args.fncall_image;
  o.node.simulate = args.simulate;
  o.node.user_namespaces = args.user_namespaces;
  o.http.max_connections = args.max_connections;
  o.http.max_client_connections = args.max_client_connections;
  o.http.header_timeout_seconds = args.header_timeout;
  o.http.body_timeout_seconds = args.body_timeout;
  o.http.body_min_rate = args.body_min_rate;
  o.output_budget_bytes = args.output_budget;
  DSEC_ASSIGN_OR_RETURN(r.node, EmbeddedNode::start(o));
  r.endpoint = r.node->endpoint();
  return r;
}

// ---- the gateway process --------------------------------------------------------------------------------

int runGatewayOnly(const Args& args) {
  auto token = readFile(args.token_file);
  if (!token.ok()) {
    DSEC_LOG(kError, kLog) << "reading the token: " << token.error().message();
    return 1;
  }
  GatewayOptions go;
  go.fleet_name = args.fleet;
  go.token = trim(*token);
  go.cpu_overcommit = args.cpu_overcommit;
  go.memory_overcommit = args.memory_overcommit;
  go.lost_after_seconds = args.lost_after;
  Gateway gateway(go);
  if (!args.seed_file.empty()) {
    if (auto seed = readFile(args.seed_file); seed.ok()) {
      auto j = json::parse(*seed, nullptr, false);
      if (j.is_object() && j.contains("nodes")) {
        for (const auto& n : j["nodes"]) {
          if (auto spec = parseNodeSpec(n); spec.ok()) (void)gateway.registerNode(*spec, true);
        }
      }
    }
  }
  (void)installStopSignals();
  HttpServerOptions ho;
  ho.listen = (args.address.empty() ? std::string("0.0.0.0") : args.address) + ":" + std::to_string(args.port);
  ho.max_connections = args.max_connections;
  ho.max_client_connections = args.max_client_connections;
  ho.header_timeout_seconds = args.header_timeout;
  ho.body_timeout_seconds = args.body_timeout;
  ho.body_min_rate = args.body_min_rate;
  auto server = HttpServer::start(ho, &gateway);
  if (!server.ok()) {
    DSEC_LOG(kError, kLog) << "gateway: " << server.error().message();
    return 1;
  }
  gateway.start();
  if (!args.port_file.empty()) (void)writeFileAtomic(args.port_file, std::to_string((*server)->port()), 0600);
  DSEC_LOG(kInfo, kLog) << "gateway of fleet " << args.fleet << " on port " << (*server)->port();
  while (!waitForStop(-1)) {
  }
  (*server)->stop();
  gateway.stop();
  return 0;
}

// Runs `dsec-launch --gateway-only` and restarts it when it dies (same port, so the fleet file stays right).
class GatewaySupervisor {
 public:
  GatewaySupervisor(std::vector<std::string> argv, std::string port_file)
      : argv_(std::move(argv)), port_file_(std::move(port_file)) {}
  ~GatewaySupervisor() { stop(); }

  // Starts the first gateway and waits for its port.
  Result<int> start(int port) {
    port_ = port;
    ::unlink(port_file_.c_str());
    thread_ = std::thread([this] { loop(); });
    for (int i = 0; i < 200; ++i) {
      if (auto text = readFile(port_file_); text.ok() && !trim(*text).empty()) {
        port_ = std::stoi(trim(*text));
        return port_.load();
      }
      ::usleep(50 * 1000);
    }
    return Error(ErrorCode::kTimeout, "the gateway did not start within 10 s");
  }

  void stop() {
    stopping_ = true;
    pid_t pid = pid_.load();
    if (pid > 0) ::kill(pid, SIGTERM);
    if (thread_.joinable()) thread_.join();
  }

 private:
  void loop() {
    // The child gets SIGTERM when this thread's process dies (PR_SET_PDEATHSIG follows the forking thread,
    // which lives as long as the supervisor).
    pid_t parent = ::getpid();
    while (!stopping_) {
      std::vector<std::string> argv = argv_;
      argv.push_back("--port");
      argv.push_back(std::to_string(port_.load()));
      std::vector<char*> cargv;
      for (auto& s : argv) cargv.push_back(s.data());
      cargv.push_back(nullptr);
      pid_t pid = ::fork();
      if (pid == 0) {
        ::prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (::getppid() != parent) ::_exit(1);
        ::execv("/proc/self/exe", cargv.data());
        ::_exit(127);
      }
      if (pid < 0) {
        ::sleep(1);
        continue;
      }
      pid_ = pid;
      int status = 0;
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      pid_ = 0;
      if (stopping_) break;
      DSEC_LOG(kWarn, kLog) << "gateway process " << pid << " ended ("
                            << (WIFSIGNALED(status) ? std::string("signal ") + strsignal(WTERMSIG(status))
                                                    : "exit " + std::to_string(WEXITSTATUS(status)))
                            << "): restarting it on port " << port_.load();
      ::usleep(200 * 1000);
    }
  }

  std::vector<std::string> argv_;
  std::string port_file_;
  std::atomic<int> port_{0};
  std::atomic<pid_t> pid_{0};
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

// ---- the launch modes ---------------------------------------------------------------------------------------

void runUntilStopped(RunningNode& node, fleet::NodeRegistrar& registrar) {
  bool deregistered = false;
  while (!waitForStop(1000)) {
    // An operator drained the node at the gateway: once empty it leaves the fleet (the job keeps running
    // until it is cancelled).
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

int runJoin(const Args& args) {
  auto text = readFile(fleetFilePath(args.join));
  if (!text.ok()) {
    DSEC_LOG(kError, kLog) << "--join " << args.join << ": " << text.error().message();
    return 1;
  }
  auto fleetfile = json::parse(*text, nullptr, false);
  if (!fleetfile.is_object() || !fleetfile.contains("endpoint") || !fleetfile.contains("token")) {
    DSEC_LOG(kError, kLog) << "--join " << args.join << ": " << fleetFilePath(args.join) << " has no endpoint/token";
    return 1;
  }
  std::string gateway = fleetfile["endpoint"].get<std::string>();
  std::string token = fleetfile["token"].get<std::string>();
  auto ep = fleet::parseEndpoint(gateway);
  if (!ep.ok()) {
    DSEC_LOG(kError, kLog) << ep.error().message();
    return 1;
  }
  (void)installStopSignals();
  auto node = startNode(args, token, ep->host);
  if (!node.ok()) {
    DSEC_LOG(kError, kLog) << "starting the node: " << node.error().message();
    return 1;
  }
  fleet::NodeRegistrar registrar(
      {gateway, token, node->name, node->endpoint, node->capacity.cpus, node->capacity.memory_bytes, 1.0});
  if (auto st = registrar.registerOnce(); !st.ok()) {
    DSEC_LOG(kError, kLog) << "joining fleet " << args.join << ": " << st.error().message();
    node->node->stop(true);
    return 1;
  }
  registrar.start();
  DSEC_LOG(kInfo, kLog) << "node " << node->name << " at " << node->endpoint << " joined fleet " << args.join;
  runUntilStopped(*node, registrar);
  // Leaving: drain first (no new sandboxes; running ones get drain_timeout to finish), then go.
  int64_t left = registrar.drain(args.drain_timeout);
  if (left > 0) DSEC_LOG(kWarn, kLog) << left << " sandboxes still running after the drain timeout: destroying them";
  registrar.deregister();
  node->node->stop(true);
  return 0;
}

// Leaves MPI once start-up is over. A rank that stays a PMIx client would take the whole step down when it dies:
// the PMIx server in slurmstepd kills every task of the step on a client's lost connection, whatever
// --kill-on-bad-exit says. A finalized rank can die (and be replaced through --join) without touching the others.
// A peer that died before its fence can hold MPI_Finalize for ever, so it gets a bounded time, then this rank exits.
void finalizeMpiWithin(double seconds, int exit_code_on_timeout) {
  std::promise<void> finished;
  std::thread watchdog([done = finished.get_future(), seconds, exit_code_on_timeout] {
    if (done.wait_for(std::chrono::duration<double>(seconds)) == std::future_status::ready) return;
    DSEC_LOG(kError, kLog) << "MPI_Finalize did not end within " << seconds << " s (a peer rank died): exiting";
    ::_exit(exit_code_on_timeout);
  });
  MPI_Finalize();
  finished.set_value();
  watchdog.join();
}

int runLaunch(const Args& args, int argc, char** argv) {
  if (auto st = validateFleetName(args.fleet); !st.ok()) {
    DSEC_LOG(kError, kLog) << st.error().message();
    return 2;
  }
  int rank = 0, size = 1;
  if (!args.no_mpi) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
  }
  auto abortAll = [&](const std::string& why) {
    DSEC_LOG(kError, kLog) << "rank " << rank << ": " << why;
    if (!args.no_mpi) MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  };
  // 1. the fleet token (rank 0 makes it)
  char token_buf[65] = {};
  if (rank == 0) std::snprintf(token_buf, sizeof(token_buf), "%s", randomHex(64).c_str());
  if (!args.no_mpi) MPI_Bcast(token_buf, sizeof(token_buf), MPI_CHAR, 0, MPI_COMM_WORLD);
  std::string token(token_buf);

  (void)installStopSignals();
  // 2. every rank starts its node
  auto node = startNode(args, token, "");
  std::string blob_text =
      node.ok() ? json{{"name", node->name},
                       {"endpoint", node->endpoint},
                       {"capacity", {{"cpus", node->capacity.cpus}, {"memory_bytes", node->capacity.memory_bytes}}}}
                      .dump()
                : json{{"error", node.error().message()}}.dump();
  std::vector<char> mine(kBlob, 0), all(static_cast<size_t>(kBlob) * size, 0);
  std::snprintf(mine.data(), kBlob, "%s", blob_text.c_str());
  // 3. exchange endpoints and capacity
  if (!args.no_mpi) {
    MPI_Allgather(mine.data(), kBlob, MPI_CHAR, all.data(), kBlob, MPI_CHAR, MPI_COMM_WORLD);
  } else {
    all = mine;
  }
  json nodes = json::array();
  std::map<std::string, int> names;
  std::string failure;
  for (int r = 0; r < size; ++r) {
    auto j = json::parse(std::string(all.data() + static_cast<size_t>(r) * kBlob), nullptr, false);
    if (!j.is_object() || j.contains("error")) {
      failure = "rank " + std::to_string(r) +
                " could not start its node: " + (j.is_object() ? j["error"].get<std::string>() : std::string("?"));
      break;
    }
    if (names.count(j["name"])) {
      failure = "ranks " + std::to_string(names[j["name"]]) + " and " + std::to_string(r) + " are both node " +
                j["name"].get<std::string>() + ": run one rank per node (--ntasks-per-node=1)";
      break;
    }
    names[j["name"]] = r;
    nodes.push_back(j);
  }
  if (!failure.empty()) {
    // Every rank saw the same table, so every rank stops here.
    if (node.ok()) node->node->stop(true);
    if (rank == 0) DSEC_LOG(kError, kLog) << failure;
    if (!args.no_mpi) finalizeMpiWithin(5, 1);
    return 1;
  }
  // 4. rank 0 starts the gateway and tells everyone where it is
  char gateway_buf[256] = {};
  std::unique_ptr<GatewaySupervisor> supervisor;
  std::string fleet_dir = node->node ? args.root + "/nodes/" + node->name : "";
  if (!args.state_dir.empty()) fleet_dir = args.state_dir;
  if (rank == 0) {
    std::string token_file = fleet_dir + "/fleet-token";
    std::string seed_file = fleet_dir + "/fleet-nodes.json";
    std::string port_file = fleet_dir + "/gateway-port";
    (void)writeFileAtomic(token_file, token, 0600);
    (void)writeFileAtomic(seed_file, json{{"fleet", args.fleet}, {"nodes", nodes}}.dump(2), 0600);
    std::string address = advertisedAddress(args, "");
    std::vector<std::string> gargv = {"dsec-launch",
                                      "--gateway-only",
                                      "--fleet",
                                      args.fleet,
                                      "--token-file",
                                      token_file,
                                      "--seed",
                                      seed_file,
                                      "--port-file",
                                      port_file,
                                      "--cpu-overcommit",
                                      std::to_string(args.cpu_overcommit),
                                      "--memory-overcommit",
                                      std::to_string(args.memory_overcommit),
                                      "--lost-after",
                                      std::to_string(args.lost_after),
                                      "--max-connections",
                                      std::to_string(args.max_connections),
                                      "--max-client-connections",
                                      std::to_string(args.max_client_connections),
                                      "--header-timeout",
                                      std::to_string(args.header_timeout),
                                      "--body-timeout",
                                      std::to_string(args.body_timeout),
                                      "--body-min-rate",
                                      std::to_string(static_cast<uint64_t>(args.body_min_rate))};
    supervisor = std::make_unique<GatewaySupervisor>(gargv, port_file);
    auto port = supervisor->start(args.port);
    if (port.ok()) {
      std::snprintf(gateway_buf, sizeof(gateway_buf), "http://%s:%d", address.c_str(), *port);
      if (auto st = writeFleetFile(args.fleet, gateway_buf, token, "gateway", args.root); !st.ok()) {
        DSEC_LOG(kError, kLog) << "writing the fleet file: " << st.error().message();
      }
    } else {
      DSEC_LOG(kError, kLog) << port.error().message();
    }
  }
  if (!args.no_mpi) MPI_Bcast(gateway_buf, sizeof(gateway_buf), MPI_CHAR, 0, MPI_COMM_WORLD);
  std::string gateway(gateway_buf);
  if (gateway.empty()) return abortAll("the gateway did not start");
  // From here on MPI is done: each rank registers and heartbeats over HTTP.
  if (!args.no_mpi) finalizeMpiWithin(30, 1);
  fleet::NodeRegistrar registrar(
      {gateway, token, node->name, node->endpoint, node->capacity.cpus, node->capacity.memory_bytes, 1.0});
  registrar.start();
  if (rank == 0) {
    DSEC_LOG(kInfo, kLog) << "fleet " << args.fleet << " of " << size << " nodes serving on " << gateway
                          << " (fleet file " << fleetFilePath(args.fleet) << ")";
  }
  runUntilStopped(*node, registrar);
  DSEC_LOG(kInfo, kLog) << "node " << node->name << " stopping: destroying its sandboxes";
  // Quickest first: mpirun follows its SIGTERM with a SIGKILL soon after.
  if (rank == 0) removeFleetFileIfOurs(args.fleet, gateway);
  registrar.stop();
  node->node->stop(true);
  if (supervisor) supervisor->stop();
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  // Every role holds the fleet token: not readable through /proc or ptrace but by host root, never in a core dump.
  prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  Args args = parseArgs(argc, argv);
  if (const char* level = std::getenv("DSEC_LOG_LEVEL")) {
    LogLevel l;
    if (parseLogLevel(level, &l)) setLogLevel(l);
  }
  if (args.gateway_only) return runGatewayOnly(args);
  if (!args.join.empty()) return runJoin(args);
  return runLaunch(args, argc, argv);
} catch (const std::exception& e) {
  std::fprintf(stderr, "dsec-launch: %s\n", e.what());
  return 1;
}
