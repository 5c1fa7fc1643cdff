// Client identity for the per-client connection budget (ClientKey.h): one sock_diag exact lookup per
// accepted connection (the kernel finds the peer's socket by its 4-tuple in its hash table; no dump).
#include "dsec/launcher/api/ClientKey.h"

#include <arpa/inet.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstring>

#include "dsec/common/Fd.h"

namespace dsec::launcher {
namespace {

constexpr unsigned kTcpTimeWait = 6;     // TCP_TIME_WAIT in the kernel's state numbering
constexpr unsigned kTcpNewSynRecv = 12;  // TCP_NEW_SYN_RECV

// An IPv4 address seen through an IPv6 socket (::ffff:a.b.c.d) becomes the plain IPv4 address.
void unmapV4(struct sockaddr_storage* ss) {
  if (ss->ss_family != AF_INET6) return;
  auto* sin6 = reinterpret_cast<struct sockaddr_in6*>(ss);
  if (!IN6_IS_ADDR_V4MAPPED(&sin6->sin6_addr)) return;
  struct sockaddr_in sin {};
  sin.sin_family = AF_INET;
  sin.sin_port = sin6->sin6_port;
  std::memcpy(&sin.sin_addr, &sin6->sin6_addr.s6_addr[12], 4);
  std::memset(ss, 0, sizeof(*ss));
  std::memcpy(ss, &sin, sizeof(sin));
}

void fillSockid(const struct sockaddr_storage& local_of_socket, const struct sockaddr_storage& remote_of_socket,
                struct inet_diag_sockid* id) {
  if (local_of_socket.ss_family == AF_INET) {
    const auto* src = reinterpret_cast<const struct sockaddr_in*>(&local_of_socket);
    const auto* dst = reinterpret_cast<const struct sockaddr_in*>(&remote_of_socket);
    id->idiag_sport = src->sin_port;
    id->idiag_dport = dst->sin_port;
    std::memcpy(id->idiag_src, &src->sin_addr, 4);
    std::memcpy(id->idiag_dst, &dst->sin_addr, 4);
  } else {
    const auto* src = reinterpret_cast<const struct sockaddr_in6*>(&local_of_socket);
    const auto* dst = reinterpret_cast<const struct sockaddr_in6*>(&remote_of_socket);
    id->idiag_sport = src->sin6_port;
    id->idiag_dport = dst->sin6_port;
    std::memcpy(id->idiag_src, &src->sin6_addr, 16);
    std::memcpy(id->idiag_dst, &dst->sin6_addr, 16);
  }
  id->idiag_if = 0;
  id->idiag_cookie[0] = INET_DIAG_NOCOOKIE;
  id->idiag_cookie[1] = INET_DIAG_NOCOOKIE;
}

int diagSocket() {
  // One per thread (the acceptor's), opened on first use and kept.
  thread_local UniqueFd fd;
  if (!fd) {
    fd = UniqueFd(::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG));
    if (fd) {
      struct timeval tv {
        1, 0
      };
      ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    }
  }
  return fd.get();
}

}  // namespace

std::optional<uint32_t> localPeerUid(int fd) {
  struct sockaddr_storage peer {
  }, local{};
  socklen_t peer_len = sizeof(peer), local_len = sizeof(local);
  if (::getpeername(fd, reinterpret_cast<struct sockaddr*>(&peer), &peer_len) != 0) return std::nullopt;
  if (::getsockname(fd, reinterpret_cast<struct sockaddr*>(&local), &local_len) != 0) return std::nullopt;
  unmapV4(&peer);
  unmapV4(&local);
  if (peer.ss_family != local.ss_family || (peer.ss_family != AF_INET && peer.ss_family != AF_INET6)) {
    return std::nullopt;
  }
  int nl = diagSocket();
  if (nl < 0) return std::nullopt;
  struct {
    struct nlmsghdr nlh;
    struct inet_diag_req_v2 req;
  } msg{};
  msg.nlh.nlmsg_len = sizeof(msg);
  msg.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  msg.nlh.nlmsg_flags = NLM_F_REQUEST;
  static thread_local uint32_t seq = 0;
  msg.nlh.nlmsg_seq = ++seq;
  msg.req.sdiag_family = static_cast<__u8>(peer.ss_family);
  msg.req.sdiag_protocol = IPPROTO_TCP;
  msg.req.idiag_states = ~0U;
  // The peer's socket: its local end is our peer address, its remote end our local address.
  fillSockid(peer, local, &msg.req.id);
  struct sockaddr_nl kernel {};
  kernel.nl_family = AF_NETLINK;
  if (::sendto(nl, &msg, sizeof(msg), 0, reinterpret_cast<struct sockaddr*>(&kernel), sizeof(kernel)) < 0) {
    return std::nullopt;
  }
  alignas(struct nlmsghdr) char buf[8192];
  for (;;) {
    ssize_t n = ::recv(nl, buf, sizeof(buf), 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return std::nullopt;
    }
    auto* h = reinterpret_cast<struct nlmsghdr*>(buf);
    size_t left = static_cast<size_t>(n);
    for (; NLMSG_OK(h, left); h = NLMSG_NEXT(h, left)) {
      if (h->nlmsg_seq != seq) continue;  // a late answer to an earlier lookup that timed out
      if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY) return std::nullopt;  // NLMSG_ERROR: no such socket here
      if (h->nlmsg_len < NLMSG_LENGTH(sizeof(struct inet_diag_msg))) return std::nullopt;
      const auto* d = reinterpret_cast<const struct inet_diag_msg*>(NLMSG_DATA(h));
      // A socket already closed (TIME_WAIT) or not yet accepted reports uid 0: that says nothing of its owner.
      if (d->idiag_state == kTcpTimeWait || d->idiag_state == kTcpNewSynRecv) return std::nullopt;
      return d->idiag_uid;
    }
  }
}

std::string addressKey(const struct sockaddr_storage& peer_in) {
  struct sockaddr_storage peer = peer_in;
  unmapV4(&peer);
  char text[INET6_ADDRSTRLEN] = {};
  if (peer.ss_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<struct sockaddr_in*>(&peer)->sin_addr, text, sizeof(text));
    return std::string("ip:") + text;
  }
  if (peer.ss_family == AF_INET6) {
    struct in6_addr a = reinterpret_cast<struct sockaddr_in6*>(&peer)->sin6_addr;
    std::memset(&a.s6_addr[8], 0, 8);  // the /64
    ::inet_ntop(AF_INET6, &a, text, sizeof(text));
    return std::string("ip6:") + text + "/64";
  }
  return "unknown";
}

std::string clientKeyOf(int fd) {
  if (auto uid = localPeerUid(fd)) return "uid:" + std::to_string(*uid);
  struct sockaddr_storage peer {};
  socklen_t len = sizeof(peer);
  if (::getpeername(fd, reinterpret_cast<struct sockaddr*>(&peer), &len) != 0) return "unknown";
  return addressKey(peer);
}

}  // namespace dsec::launcher
