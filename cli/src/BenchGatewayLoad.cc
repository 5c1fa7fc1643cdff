#include "BenchGatewayLoad.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "Progress.h"
#include "dsec/common/Strings.h"

namespace dsec::cli {
namespace {

// A lean HTTP/1.1 client on one keep-alive connection: the request bytes are built once, the answer is read
// with one recv per segment and only its status, length and "id" are looked at, so the load generator takes
// as little as possible of the CPUs it shares with what it measures.
class RawClient {
 public:
  RawClient(int port, std::string request) : port_(port), request_(std::move(request)) {}
  ~RawClient() { close(); }
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  // One create: the HTTP status (0 on a transport error, with *body saying what) and the body.
  int create(std::string* body) {
    for (int attempt = 0; attempt < 2; ++attempt) {
      if (fd_ < 0 && !connect(body)) return 0;
      if (!sendAll()) {
        close();
        continue;  // a connection the server closed: once more on a new one
      }
      int status = readResponse(body);
      if (status == 0) close();
      return status;
    }
    *body = "cannot send to the gateway";
    return 0;
  }

 private:
  bool connect(std::string* why) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) {
      *why = std::string("socket: ") + strerror(errno);
      return false;
    }
    sockaddr_in sin{};
    sin.sin_family = AF_INET;
    sin.sin_port = htons(static_cast<uint16_t>(port_));
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&sin), sizeof(sin)) != 0) {
      *why = std::string("connect: ") + strerror(errno);
      close();
      return false;
    }
    int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    timeval tv{60, 0};  // a hung gateway fails the run instead of hanging it
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return true;
  }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    buf_.clear();
  }
  bool sendAll() {
    size_t off = 0;
    while (off < request_.size()) {
      ssize_t n = ::send(fd_, request_.data() + off, request_.size() - off, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      off += static_cast<size_t>(n);
    }
    return true;
  }
  bool fill() {
    char tmp[16384];
    for (;;) {
      ssize_t n = ::recv(fd_, tmp, sizeof(tmp), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      buf_.append(tmp, static_cast<size_t>(n));
      return true;
    }
  }
  int readResponse(std::string* body) {
    size_t head_end;
    while ((head_end = buf_.find("\r\n\r\n")) == std::string::npos) {
      if (!fill()) {
        *body = "the gateway closed the connection or timed out";
        return 0;
      }
    }
    std::string head = toLower(buf_.substr(0, head_end));
    int status = 0;
    if (head.size() > 12 && startsWith(head, "http/1.1 ")) status = std::atoi(head.c_str() + 9);
    size_t length = 0;
    if (auto cl = head.find("\r\ncontent-length:"); cl != std::string::npos) {
      length = std::strtoull(head.c_str() + cl + 17, nullptr, 10);
    } else {
      *body = "answer without Content-Length: " + head;
      return 0;
    }
    bool closing = head.find("\r\nconnection: close") != std::string::npos;
    size_t need = head_end + 4 + length;
    while (buf_.size() < need) {
      if (!fill()) {
        *body = "the gateway closed the connection mid-answer";
        return 0;
      }
    }
    body->assign(buf_, head_end + 4, length);
    buf_.erase(0, need);
    if (closing) close();
    return status;
  }
  static std::string toLower(std::string s) {
    for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  }

  int port_;
  std::string request_;
  int fd_ = -1;
  std::string buf_;
};

std::string idOf(const std::string& body) {
  auto at = body.find("\"id\":\"");
  if (at == std::string::npos) return "";
  at += 6;
  auto end = body.find('"', at);
  return end == std::string::npos ? "" : body.substr(at, end - at);
}

double processCpuSeconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

}  // namespace

CreateLoadResult runCreateLoad(const CreateLoad& load) {
  // Each worker keeps its own samples; the first `warmup` creates warm the connections and pools.
  struct Worker {
    std::vector<double> latencies_ms;
    std::vector<std::string> ids;
    int failures = 0;
    std::string first_error;
  };
  std::vector<Worker> workers(static_cast<size_t>(load.concurrency));
  std::atomic<int> next{0};
  const int total = load.warmup + load.count;
  std::atomic<double> measure_start{0};
  std::atomic<int> warm_done{0};
  std::vector<std::thread> threads;
  threads.reserve(workers.size());
  for (size_t w = 0; w < workers.size(); ++w) {
    threads.emplace_back([&, w] {
      Worker& me = workers[w];
      me.latencies_ms.reserve(static_cast<size_t>(load.count) / static_cast<size_t>(load.concurrency) + 16);
      RawClient client(load.port, load.request);
      std::string answer;
      for (int i = next++; i < total; i = next++) {
        double t0 = monotonicSeconds();
        int status = client.create(&answer);
        double t1 = monotonicSeconds();
        if (load.progress != nullptr) load.progress->advance();
        bool measured = i >= load.warmup;
        if (!measured && ++warm_done == load.warmup) measure_start.store(t1);
        std::string id = status == 201 ? idOf(answer) : "";
        if (id.empty()) {
          if (measured) ++me.failures;
          if (me.first_error.empty()) me.first_error = std::to_string(status) + " " + answer.substr(0, 400);
          continue;
        }
        me.ids.push_back(std::move(id));
        if (measured) me.latencies_ms.push_back((t1 - t0) * 1000.0);
      }
    });
  }
  CreateLoadResult result;
  const double cpu0 = processCpuSeconds();
  result.wall_start = monotonicSeconds();
  for (auto& t : threads) t.join();
  result.end = monotonicSeconds();
  result.cpu_seconds = processCpuSeconds() - cpu0;
  result.measure_start = load.warmup > 0 ? measure_start.load() : result.wall_start;
  if (result.measure_start <= 0) result.measure_start = result.wall_start;
  for (auto& w : workers) {
    result.latencies_ms.insert(result.latencies_ms.end(), w.latencies_ms.begin(), w.latencies_ms.end());
    result.failures += w.failures;
    if (result.first_error.empty()) result.first_error = w.first_error;
    for (auto& id : w.ids) result.ids.push_back(std::move(id));
  }
  return result;
}

}  // namespace dsec::cli
