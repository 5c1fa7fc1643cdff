#include "NodeResolver.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <ctime>
#include <sstream>

#include "DnsMessage.h"
#include "dsec/common/Logging.h"
#include "dsec/common/Strings.h"

namespace dsec::backends {
namespace {

constexpr int kQueriesPerWakeup = 64;  // per listener and turn of the loop: one busy sandbox cannot starve the rest

sockaddr_in socketAddress(uint32_t ip4, uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(ip4);
  a.sin_port = htons(port);
  return a;
}

std::string ip4Text(uint32_t ip4) {
  in_addr a{htonl(ip4)};
  char buf[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &a, buf, sizeof buf);
  return buf;
}

uint16_t randomId() {
  uint16_t id = 0;
  if (getrandom(&id, sizeof id, 0) != sizeof id) id = static_cast<uint16_t>(monotonicSeconds() * 1e6);
  return id;
}

}  // namespace

Result<Ip4Endpoint> parseIp4Endpoint(const std::string& text) {
  Ip4Endpoint out;
  std::string host = text;
  if (auto colon = text.rfind(':'); colon != std::string::npos) {
    host = text.substr(0, colon);
    const std::string port = text.substr(colon + 1);
    if (port.empty() || port.size() > 5 || !std::all_of(port.begin(), port.end(), ::isdigit) || std::stoi(port) < 1 ||
        std::stoi(port) > 65535) {
      return Error::invalid("DNS upstream \"" + text + "\": the port must be 1..65535");
    }
    out.port = static_cast<uint16_t>(std::stoi(port));
  }
  in_addr a{};
  if (inet_pton(AF_INET, host.c_str(), &a) != 1) {
    return Error::invalid("DNS upstream \"" + text + "\": expected an IPv4 ADDR or ADDR:PORT");
  }
  out.ip4 = ntohl(a.s_addr);
  return out;
}

Ip4Endpoint firstNameserver(const std::string& resolv_conf_text) {
  std::istringstream in(resolv_conf_text);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string key, value;
    if (!(words >> key >> value) || key != "nameserver") continue;
    in_addr a{};
    if (inet_pton(AF_INET, value.c_str(), &a) == 1) return {ntohl(a.s_addr), 53};
  }
  return {};
}

Result<UniqueFd> NodeResolver::bindUdp(uint32_t address) {
  UniqueFd fd(::socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return Error::sys(errno, "DNS socket");
  sockaddr_in at = socketAddress(address, 53);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&at), sizeof at) != 0) {
    return Error::sys(errno, "bind " + ip4Text(address) + ":53");
  }
  return fd;
}

Result<std::unique_ptr<NodeResolver>> NodeResolver::start(const std::vector<uint32_t>& addresses,
                                                          const std::function<Status(uint32_t)>& add_address,
                                                          Ip4Endpoint upstream, Hooks hooks) {
  std::unique_ptr<NodeResolver> resolver(new NodeResolver(upstream, std::move(hooks)));
  resolver->wake_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!resolver->wake_) return Error::sys(errno, "eventfd for the DNS resolver");
  std::string taken;
  for (uint32_t address : addresses) {
    DSEC_TRY(add_address(address));
    auto bound = bindUdp(address);
    if (!bound.ok()) {
      if (bound.error().sysErrno() != EADDRINUSE) return bound.error();
      taken += (taken.empty() ? "" : ", ") + ip4Text(address);
      continue;  // another agent's resolver
    }
    resolver->address_ = address;
    resolver->listeners_[address] = std::move(bound).value();
    break;
  }
  if (resolver->address_ == 0) {
    return Error(ErrorCode::kUnavailable, "every resolver address of the egress subnet is taken (" + taken +
                                              "): too many agents share this subnet on the node");
  }
  resolver->thread_ = std::thread([r = resolver.get()] { r->run(); });
  return resolver;
}

NodeResolver::~NodeResolver() {
  stop_ = true;
  if (thread_.joinable()) {
    const uint64_t one = 1;
    (void)!::write(wake_.get(), &one, sizeof one);
    thread_.join();
  }
}

Status NodeResolver::alsoServe(uint32_t address) {
  std::lock_guard lock(mu_);
  if (listeners_.count(address)) return okStatus();
  DSEC_ASSIGN_OR_RETURN(UniqueFd fd, bindUdp(address));
  listeners_[address] = std::move(fd);
  const uint64_t one = 1;
  (void)!::write(wake_.get(), &one, sizeof one);
  return okStatus();
}

void NodeResolver::run() {
  std::vector<pollfd> fds;
  while (!stop_) {
    fds.clear();
    fds.push_back({wake_.get(), POLLIN, 0});
    {
      std::lock_guard lock(mu_);
      for (const auto& [address, fd] : listeners_) fds.push_back({fd.get(), POLLIN, 0});
    }
    const size_t first_pending = fds.size();
    double next_deadline = monotonicSeconds() + 1;
    for (const auto& p : pending_) {
      fds.push_back({p->upstream.get(), POLLIN, 0});
      next_deadline = std::min(next_deadline, p->deadline);
    }
    const int wait_ms = std::max(0, static_cast<int>(std::ceil((next_deadline - monotonicSeconds()) * 1000)));
    if (::poll(fds.data(), fds.size(), wait_ms) < 0 && errno != EINTR) {
      DSEC_LOG(kWarn, "container") << "DNS resolver: poll: " << std::strerror(errno);
      return;
    }
    if (fds[0].revents != 0) {
      uint64_t count = 0;
      (void)!::read(wake_.get(), &count, sizeof count);
    }
    // Answers first (and timeouts), so a query that finishes frees its slot for those waiting in the listeners.
    const double now = monotonicSeconds();
    std::vector<std::unique_ptr<Pending>> still;
    for (size_t i = 0; i < pending_.size(); ++i) {
      Pending& p = *pending_[i];
      const bool ready = fds[first_pending + i].revents != 0;
      if (ready) finish(p);
      if (!ready && p.deadline > now) {
        still.push_back(std::move(pending_[i]));
        continue;
      }
      if (!ready) reply(p.listener, p.client_ip4, p.client_port, dns::headerReply(p.query, dns::kServFail));
      if (--in_flight_[p.cookie] <= 0) in_flight_.erase(p.cookie);
    }
    pending_ = std::move(still);
    for (size_t i = 1; i < first_pending; ++i) {
      if (fds[i].revents != 0) readQueries(fds[i].fd);
    }
  }
}

void NodeResolver::readQueries(int listener) {
  for (int n = 0; n < kQueriesPerWakeup; ++n) {
    std::vector<uint8_t> buf(dns::kMaxMessage);
    sockaddr_in from{};
    socklen_t from_len = sizeof from;
    const ssize_t got =
        ::recvfrom(listener, buf.data(), buf.size(), MSG_TRUNC, reinterpret_cast<sockaddr*>(&from), &from_len);
    if (got < 0) return;                                                                // EAGAIN: drained
    if (static_cast<size_t>(got) > buf.size() || from.sin_family != AF_INET) continue;  // no query is that long
    buf.resize(static_cast<size_t>(got));
    handleQuery(listener, ntohl(from.sin_addr.s_addr), ntohs(from.sin_port), std::move(buf));
  }
}

void NodeResolver::handleQuery(int listener, uint32_t ip4, uint16_t port, std::vector<uint8_t> query) {
  const uint64_t cookie = hooks_.sandbox_of(ip4);
  if (cookie == 0) return;  // no sandbox of ours: no answer (the resolver answers nobody else)
  auto question = dns::parseQuery(query);
  if (!question.ok()) {
    if (query.size() >= dns::kHeaderSize) reply(listener, ip4, port, dns::headerReply(query, dns::kFormErr));
    return;
  }
  auto verdict = hooks_.verdict(cookie, question->name);
  if (!verdict) return;  // its policy went (destroyed) meanwhile
  if (*verdict == NameVerdict::kDenied) {
    Violation v;
    v.time_unix = static_cast<double>(time(nullptr));
    v.kind = ViolationKind::kDns;
    v.target = question->name;
    v.detail = "name not in the egress policy";
    hooks_.report(cookie, std::move(v));
    reply(listener, ip4, port, dns::replyTo(query, *question, dns::kRefused));
    return;
  }
  if (question->type == dns::kTypeAaaa) {
    reply(listener, ip4, port, dns::replyTo(query, *question, dns::kNoError));
    return;
  }
  forward(listener, ip4, port, std::move(query), cookie, *verdict == NameVerdict::kAllowed);
}

void NodeResolver::forward(int listener, uint32_t ip4, uint16_t port, std::vector<uint8_t> query, uint64_t cookie,
                           bool opens) {
  auto servfail = [&] { reply(listener, ip4, port, dns::headerReply(query, dns::kServFail)); };
  if (upstream_.ip4 == 0 || pending_.size() >= static_cast<size_t>(kMaxInFlight) ||
      in_flight_[cookie] >= kMaxInFlightPerSandbox) {
    if (in_flight_[cookie] == 0) in_flight_.erase(cookie);
    return servfail();
  }
  auto p = std::make_unique<Pending>();
  p->upstream.reset(::socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  const sockaddr_in to = socketAddress(upstream_.ip4, upstream_.port);
  if (!p->upstream || ::connect(p->upstream.get(), reinterpret_cast<const sockaddr*>(&to), sizeof to) != 0) {
    if (in_flight_[cookie] == 0) in_flight_.erase(cookie);
    return servfail();
  }
  p->cookie = cookie;
  p->listener = listener;
  p->client_ip4 = ip4;
  p->client_port = port;
  p->client_id = dns::messageId(query);
  p->upstream_id = randomId();
  p->opens = opens;
  p->deadline = monotonicSeconds() + kUpstreamTimeout;
  std::vector<uint8_t> out = query;
  dns::setId(out, p->upstream_id);
  if (::send(p->upstream.get(), out.data(), out.size(), 0) != static_cast<ssize_t>(out.size())) {
    if (in_flight_[cookie] == 0) in_flight_.erase(cookie);
    return servfail();
  }
  p->query = std::move(query);
  ++in_flight_[cookie];
  pending_.push_back(std::move(p));
}

void NodeResolver::finish(Pending& p) {
  std::vector<uint8_t> answer(dns::kMaxMessage);
  const ssize_t got = ::recv(p.upstream.get(), answer.data(), answer.size(), MSG_TRUNC);
  auto servfail = [&] { reply(p.listener, p.client_ip4, p.client_port, dns::headerReply(p.query, dns::kServFail)); };
  if (got < 0 || static_cast<size_t>(got) > answer.size()) return servfail();  // refused (ICMP) or oversized
  answer.resize(static_cast<size_t>(got));
  auto question = dns::parseQuery(p.query);  // parsed before: cannot fail
  if (!question.ok()) return servfail();
  auto rcode = dns::checkAnswer(answer, p.upstream_id, *question);
  if (!rcode.ok()) return servfail();
  if (p.opens && *rcode == dns::kNoError) {
    auto addresses = dns::answerAddresses(answer, question->name);
    if (!addresses.ok()) return servfail();
    for (const auto& a : *addresses) {
      const double ttl = std::clamp(static_cast<double>(a.ttl), kMinTtl, kMaxTtl);
      if (auto s = hooks_.allow(p.cookie, question->name, a.ip4, ttl); !s.ok()) {
        DSEC_LOG(kWarn, "container") << "DNS resolver: " << s.error().toString();
        return servfail();
      }
    }
  }
  dns::setId(answer, p.client_id);
  reply(p.listener, p.client_ip4, p.client_port, answer);
}

void NodeResolver::reply(int listener, uint32_t ip4, uint16_t port, const std::vector<uint8_t>& message) {
  const sockaddr_in to = socketAddress(ip4, port);
  (void)::sendto(listener, message.data(), message.size(), MSG_DONTWAIT, reinterpret_cast<const sockaddr*>(&to),
                 sizeof to);
}

}  // namespace dsec::backends
