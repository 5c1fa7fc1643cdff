#include "BenchImageStartSetup.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <iostream>

#include "dsec/common/Logging.h"
#include "dsec/common/Process.h"
#include "dsec/common/Strings.h"
#include "dsec/fs3/LayerStore.h"

namespace dsec::cli {
namespace {

constexpr const char* kNetns = "dsec-bench-store";
constexpr const char* kHostVeth = "dsbench0";
constexpr const char* kStoreVeth = "dsbench1";
constexpr const char* kHostAddress = "10.213.77.1";
constexpr const char* kStoreAddress = "10.213.77.2";
constexpr const char* kToolkitCmd =
    "apt-get update && apt-get install -y --no-install-recommends python3 patch && apt-get clean && "
    "rm -rf /var/lib/apt/lists/*";

std::string selfExe() { return selfExeDir() + "/dsec"; }

Status run(const std::vector<std::string>& argv) {
  CommandOptions options;
  options.timeout_seconds = 30;
  auto out = runCommandChecked(argv, options);
  return out.ok() ? okStatus() : Status(out.error());
}

Status buildLayer(const std::string& root, const fs3::LayerRef& ref, std::vector<std::string> how) {
  std::vector<std::string> argv{selfExe(), "layer", "build", ref.toString()};
  argv.insert(argv.end(), how.begin(), how.end());
  argv.insert(argv.end(), {"--root", root});
  std::cerr << "image-start: building layer " << ref.toString() << " (once; kept in " << root << ")\n";
  CommandOptions options;
  options.timeout_seconds = 3600;
  auto out = runCommandChecked(argv, options);
  return out.ok() ? okStatus() : Status(out.error());
}

}  // namespace

Status ensureBenchImage(const std::string& root, const std::vector<fs3::LayerRef>& image) {
  fs3::LayerStore store(root);
  const bool is_default = fs3::imageToString(image) == kImageStartDefaultImage;
  for (const auto& ref : image) {
    if (store.exists(ref)) continue;
    if (!is_default) {
      return Error::notFound("layer " + ref.toString() + " is not in " + root +
                             " (build it, or use the default image)");
    }
    if (ref.name == "debian") {
      DSEC_TRY(buildLayer(root, ref, {"--debootstrap", "bookworm"}));
    } else if (ref.name == "python") {
      DSEC_TRY(buildLayer(root, ref, {"--on", "debian:12", "--run", kToolkitCmd}));
    } else {
      const std::string tmp = root + "/bench-ws-" + randomHex(8);
      DSEC_TRY(makeDirs(tmp + "/workspace", 0755));
      // A repository and its virtualenv's packages, as an agent's workspace holds them.
      Status copied = run({"cp", "-a", "/usr/include", tmp + "/workspace/repo"});
      if (copied.ok()) copied = makeDirs(tmp + "/workspace/venv/lib", 0755);
      if (copied.ok()) copied = run({"cp", "-a", "/usr/lib/python3", tmp + "/workspace/venv/lib/python3"});
      Status built = copied.ok() ? buildLayer(root, ref, {"--from-dir", tmp}) : copied;
      (void)removeTree(tmp);
      DSEC_TRY(built);
    }
  }
  return okStatus();
}

Result<std::unique_ptr<StoreLink>> StoreLink::create(const std::string& rate) {
  if (findProgram("ip").empty() || findProgram("tc").empty()) {
    return Error(ErrorCode::kUnsupported, "ip and tc (iproute2) are needed for the store's network link");
  }
  // Left by a run that was killed: gone first (errors ignored: usually there is nothing).
  (void)runCommand({"ip", "netns", "del", kNetns});
  (void)runCommand({"ip", "link", "del", kHostVeth});
  std::unique_ptr<StoreLink> link(new StoreLink());
  DSEC_TRY(run({"ip", "netns", "add", kNetns}));
  link->netns_ = kNetns;  // from here the destructor removes it
  link->store_address_ = kStoreAddress;
  const std::string cidr = "/30";
  const std::vector<std::string> in_ns{"ip", "netns", "exec", kNetns};
  auto ns = [&](std::vector<std::string> argv) {
    argv.insert(argv.begin(), in_ns.begin(), in_ns.end());
    return run(argv);
  };
  DSEC_TRY(run({"ip", "link", "add", kHostVeth, "type", "veth", "peer", "name", kStoreVeth}));
  DSEC_TRY(run({"ip", "link", "set", kStoreVeth, "netns", kNetns}));
  DSEC_TRY(run({"ip", "addr", "add", std::string(kHostAddress) + cidr, "dev", kHostVeth}));
  DSEC_TRY(run({"ip", "link", "set", kHostVeth, "up"}));
  DSEC_TRY(ns({"ip", "addr", "add", std::string(kStoreAddress) + cidr, "dev", kStoreVeth}));
  DSEC_TRY(ns({"ip", "link", "set", kStoreVeth, "up"}));
  DSEC_TRY(ns({"ip", "link", "set", "lo", "up"}));
  // Both directions shaped: requests one way, chunks the other. A 1 MiB burst: one chunk may go at line rate.
  const std::vector<std::string> tbf{"root", "tbf", "rate", rate, "burst", "1mb", "latency", "100ms"};
  std::vector<std::string> host_tc{"tc", "qdisc", "replace", "dev", kHostVeth};
  host_tc.insert(host_tc.end(), tbf.begin(), tbf.end());
  DSEC_TRY(run(host_tc));
  std::vector<std::string> store_tc{"tc", "qdisc", "replace", "dev", kStoreVeth};
  store_tc.insert(store_tc.end(), tbf.begin(), tbf.end());
  DSEC_TRY(ns(store_tc));
  return link;
}

StoreLink::~StoreLink() {
  if (netns_.empty()) return;
  (void)runCommand({"ip", "netns", "del", netns_});  // takes the veth pair with it
  (void)runCommand({"ip", "link", "del", kHostVeth});
}

Result<std::unique_ptr<StoreServerProcess>> StoreServerProcess::start(const StoreLink& link,
                                                                      const std::string& store_dir, int latency_ms,
                                                                      const std::string& log_path) {
  // stdout (its one "serving" line, and a last one at exit) comes to us; its log goes to log_path, so that no pipe
  // fills while nobody reads it.
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) return Error::sys(errno, "pipe");
  UniqueFd read_end(pipe_fds[0]), write_end(pipe_fds[1]);
  UniqueFd log(::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!log) return Error::sys(errno, "create " + log_path);
  const std::string listen = link.storeAddress() + ":8480";
  std::vector<std::string> args{"ip",
                                "netns",
                                "exec",
                                link.netns(),
                                selfExe(),
                                "layer",
                                "serve",
                                "--store",
                                store_dir,
                                "--listen",
                                listen,
                                "--latency-ms",
                                std::to_string(latency_ms),
                                "--accept-recordings"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string ip = findProgram("ip");
  pid_t pid = ::fork();
  if (pid < 0) return Error::sys(errno, "fork");
  if (pid == 0) {
    ::dup2(write_end.get(), STDOUT_FILENO);
    ::dup2(log.get(), STDERR_FILENO);
    ::execv(ip.c_str(), argv.data());
    ::_exit(127);
  }
  write_end.reset();
  std::unique_ptr<StoreServerProcess> server(new StoreServerProcess());
  server->pid_ = pid;  // from here its destructor stops it, whatever happens below
  server->output_ = std::move(read_end);
  auto failed = [&](ErrorCode code, const std::string& what) {
    auto text = readFile(log_path);
    return Error(code, what + (text.ok() && !text->empty()
                                   ? ": " + trim(text->substr(text->size() > 2000 ? text->size() - 2000 : 0))
                                   : std::string()));
  };
  // Its first line says where it serves ("serving DIR at http://ADDR:PORT").
  std::string seen;
  const double deadline = monotonicSeconds() + 15;
  while (seen.find('\n') == std::string::npos) {
    struct pollfd p {
      server->output_.get(), POLLIN, 0
    };
    const int wait_ms = static_cast<int>((deadline - monotonicSeconds()) * 1000);
    if (wait_ms <= 0 || ::poll(&p, 1, wait_ms) <= 0)
      return failed(ErrorCode::kTimeout, "the store server did not start");
    char buf[512];
    ssize_t n = ::read(server->output_.get(), buf, sizeof(buf));
    if (n <= 0) return failed(ErrorCode::kUnavailable, "the store server exited");
    seen.append(buf, static_cast<size_t>(n));
  }
  const auto at = seen.find(" at http://");
  if (seen.rfind("serving ", 0) != 0 || at == std::string::npos) {
    return failed(ErrorCode::kUnavailable, "the store server did not start: " + trim(seen));
  }
  server->url_ = trim(seen.substr(at + 4, seen.find('\n') - at - 4));
  return server;
}

StoreServerProcess::~StoreServerProcess() {
  if (pid_ > 0) {
    ::kill(pid_, SIGTERM);
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
  }
}

}  // namespace dsec::cli
