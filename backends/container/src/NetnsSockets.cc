// Work inside a sandbox's network namespace from the agent: a short-lived thread joins it (a network namespace is
// per thread), so nothing else of the agent changes namespace.
#include <arpa/inet.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <optional>
#include <thread>

#include "EgressFilter.h"

#ifndef SO_NETNS_COOKIE
#define SO_NETNS_COOKIE 71
#endif

namespace dsec::backends {
namespace {

// Runs fn on a thread in the network namespace of the process behind pidfd.
template <typename T>
Result<T> inNetns(int pidfd, const std::function<Result<T>()>& fn) {
  std::optional<Result<T>> out;
  std::thread([&] {
    if (setns(pidfd, CLONE_NEWNET) != 0) {
      out = Error::sys(errno, "join the sandbox's network namespace");
      return;
    }
    out = fn();
  }).join();
  return std::move(*out);
}

struct DiagSocket {
  inet_diag_sockid id{};
  uint8_t family = 0;
};

// Lists the sockets of one family and protocol (every state) in the calling thread's namespace.
// A sock_diag request for sockets of one family and protocol in every state: a dump (type SOCK_DIAG_BY_FAMILY)
// or one socket's destruction (SOCK_DESTROY, with its id).
struct DiagRequest {
  nlmsghdr header;
  inet_diag_req_v2 request;
};
DiagRequest diagRequest(uint16_t type, uint16_t flags, uint8_t family, uint8_t protocol) {
  DiagRequest req{};
  req.header.nlmsg_len = sizeof req;
  req.header.nlmsg_type = type;
  req.header.nlmsg_flags = NLM_F_REQUEST | flags;
  req.request.sdiag_family = family;
  req.request.sdiag_protocol = protocol;
  req.request.idiag_states = ~0U;
  return req;
}

Result<std::vector<DiagSocket>> dumpSockets(int nl, uint8_t family, uint8_t protocol) {
  const DiagRequest req = diagRequest(SOCK_DIAG_BY_FAMILY, NLM_F_DUMP, family, protocol);
  if (::send(nl, &req, sizeof req, 0) < 0) return Error::sys(errno, "sock_diag dump");
  std::vector<DiagSocket> out;
  alignas(nlmsghdr) char buf[16384];
  for (;;) {
    ssize_t n = ::recv(nl, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Error::sys(errno, "sock_diag dump");
    for (auto* h = reinterpret_cast<nlmsghdr*>(buf); NLMSG_OK(h, static_cast<unsigned>(n)); h = NLMSG_NEXT(h, n)) {
      if (h->nlmsg_type == NLMSG_DONE) return out;
      if (h->nlmsg_type == NLMSG_ERROR) {
        return Error::sys(-reinterpret_cast<nlmsgerr*>(NLMSG_DATA(h))->error, "sock_diag dump");
      }
      const auto* msg = reinterpret_cast<const inet_diag_msg*>(NLMSG_DATA(h));
      out.push_back({msg->id, msg->idiag_family});
    }
  }
}

Status destroySocket(int nl, const DiagSocket& socket, uint8_t protocol) {
  DiagRequest req = diagRequest(SOCK_DESTROY, NLM_F_ACK, socket.family, protocol);
  req.request.id = socket.id;
  if (::send(nl, &req, sizeof req, 0) < 0) return Error::sys(errno, "sock_diag destroy");
  alignas(nlmsghdr) char buf[1024];
  ssize_t n;
  do {
    n = ::recv(nl, buf, sizeof buf, 0);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return Error::sys(errno, "sock_diag destroy");
  const auto* h = reinterpret_cast<const nlmsghdr*>(buf);
  if (h->nlmsg_type == NLMSG_ERROR) {
    const int err = -reinterpret_cast<const nlmsgerr*>(NLMSG_DATA(h))->error;
    // Gone meanwhile: nothing to cut.
    if (err != 0 && err != ENOENT) return Error::sys(err, "sock_diag destroy");
  }
  return okStatus();
}

// The IPv4 peer of a socket (an IPv6 socket's v4-mapped peer too); false for none or a real IPv6 peer.
bool ip4Peer(const DiagSocket& s, uint32_t* ip4) {
  if (s.family == AF_INET) {
    *ip4 = ntohl(s.id.idiag_dst[0]);
    return *ip4 != 0;
  }
  if (s.id.idiag_dst[0] == 0 && s.id.idiag_dst[1] == 0 && s.id.idiag_dst[2] == htonl(0xffff)) {
    *ip4 = ntohl(s.id.idiag_dst[3]);
    return *ip4 != 0;
  }
  return false;
}

}  // namespace

Result<uint64_t> ownNetnsCookie() {
  UniqueFd s(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!s) return Error::sys(errno, "socket");
  uint64_t cookie = 0;
  socklen_t len = sizeof cookie;
  if (getsockopt(s.get(), SOL_SOCKET, SO_NETNS_COOKIE, &cookie, &len) != 0) {
    return Error(ErrorCode::kUnsupported, "the kernel has no network namespace cookies (SO_NETNS_COOKIE, Linux 5.14)",
                 errno);
  }
  return cookie;
}

Result<uint64_t> netnsCookieOf(int pidfd) {
  return inNetns<uint64_t>(pidfd, [] { return ownNetnsCookie(); });
}

Result<int> cutSockets(int pidfd, const std::function<bool(uint32_t ip4, uint16_t port)>& keep) {
  return inNetns<int>(pidfd, [&]() -> Result<int> {
    UniqueFd nl(::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG));
    if (!nl) return Error::sys(errno, "sock_diag socket");
    int cut = 0;
    for (uint8_t protocol : {uint8_t{IPPROTO_TCP}, uint8_t{IPPROTO_UDP}}) {
      for (uint8_t family : {uint8_t{AF_INET}, uint8_t{AF_INET6}}) {
        DSEC_ASSIGN_OR_RETURN(std::vector<DiagSocket> sockets, dumpSockets(nl.get(), family, protocol));
        for (const auto& s : sockets) {
          uint32_t ip4 = 0;
          if (!ip4Peer(s, &ip4) || keep(ip4, ntohs(s.id.idiag_dport))) continue;
          DSEC_TRY(destroySocket(nl.get(), s, protocol));
          ++cut;
        }
      }
    }
    return cut;
  });
}

}  // namespace dsec::backends
