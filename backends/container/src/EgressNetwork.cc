#include "EgressNetwork.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_addr.h>
#include <linux/if_link.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sockios.h>
#include <linux/veth.h>
#include <netinet/in.h>
#include <nftables/libnftables.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <vector>

#include "dsec/common/Fd.h"
#include "dsec/common/Logging.h"
#include "dsec/common/Strings.h"

namespace dsec::backends {
namespace {

constexpr const char* kTable = "dsec_egress";

std::string ipString(uint32_t host_order) {
  in_addr a{htonl(host_order)};
  char buf[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &a, buf, sizeof buf);
  return buf;
}

// The node's rules: sandboxes reach the world through the node and nothing of the node itself but the
// resolvers (resolvers: the subnet's first /28, UDP port 53).
std::string ruleset(const std::string& subnet, const std::string& resolvers) {
  return std::string("table inet ") + kTable + "\n" + "delete table inet " + kTable + "\n" + "table inet " + kTable +
         " {\n"
         "  chain input {\n"
         "    type filter hook input priority filter - 10; policy accept;\n"
         "    iifname \"dsv*\" ip daddr " +
         resolvers +
         " udp dport 53 accept\n"
         "    iifname \"dsv*\" drop\n"
         "  }\n"
         // The node's own packets to a sandbox (any local user's) leave through output, not forward: only
         // answers and errors (PMTU, unreachable) about the sandbox's own connections go in.
         "  chain output {\n"
         "    type filter hook output priority filter - 10; policy accept;\n"
         "    oifname \"dsv*\" ct state established,related accept\n"
         "    oifname \"dsv*\" drop\n"
         "  }\n"
         "  chain forward {\n"
         "    type filter hook forward priority filter - 10; policy accept;\n"
         "    oifname \"dsv*\" ct state established,related accept\n"
         "    oifname \"dsv*\" drop\n"
         "    iifname \"dsv*\" meta nfproto ipv6 drop\n"
         "    iifname \"dsv*\" ip daddr { 0.0.0.0/8, 127.0.0.0/8, 169.254.0.0/16, 224.0.0.0/3, " +
         subnet +
         " } drop\n"
         "  }\n"
         "  chain postrouting {\n"
         "    type nat hook postrouting priority srcnat; policy accept;\n"
         "    ip saddr " +
         subnet +
         " oifname != \"dsv*\" masquerade\n"
         "  }\n"
         "}\n";
}

Status runNft(const std::string& commands) {
  nft_ctx* ctx = nft_ctx_new(NFT_CTX_DEFAULT);
  if (ctx == nullptr) return Error(ErrorCode::kSystem, "nftables: cannot create a context");
  nft_ctx_buffer_output(ctx);
  nft_ctx_buffer_error(ctx);
  int rc = nft_run_cmd_from_buffer(ctx, commands.c_str());
  std::string err = nft_ctx_get_error_buffer(ctx) != nullptr ? nft_ctx_get_error_buffer(ctx) : "";
  nft_ctx_free(ctx);
  if (rc != 0) return Error(ErrorCode::kUnsupported, "nftables refused the egress rules: " + trim(err));
  return okStatus();
}

Status writeSysctl(const std::string& path, const std::string& value) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
  if (!fd) return Error::sys(errno, "open " + path);
  if (::write(fd.get(), value.data(), value.size()) != static_cast<ssize_t>(value.size())) {
    return Error::sys(errno, "write " + path);
  }
  return okStatus();
}

// A netlink request under construction: attributes appended, nests closed by length fix-ups.
class NetlinkMessage {
 public:
  explicit NetlinkMessage(uint16_t type, uint16_t flags) {
    nlmsghdr h{};
    h.nlmsg_type = type;
    h.nlmsg_flags = flags;
    h.nlmsg_seq = 1;
    append(&h, sizeof h);
  }
  void append(const void* data, size_t len) {
    const auto* p = static_cast<const char*>(data);
    buf_.insert(buf_.end(), p, p + len);
    buf_.resize(NLMSG_ALIGN(buf_.size()));
  }
  void attr(uint16_t type, const void* data, size_t len) {
    rtattr a{};
    a.rta_type = type;
    a.rta_len = static_cast<uint16_t>(RTA_LENGTH(len));
    size_t at = buf_.size();
    buf_.resize(at + RTA_SPACE(len));
    std::memcpy(buf_.data() + at, &a, sizeof a);
    std::memcpy(buf_.data() + at + RTA_LENGTH(0), data, len);
  }
  void attrString(uint16_t type, const std::string& s) { attr(type, s.c_str(), s.size() + 1); }
  size_t beginNest(uint16_t type) {
    size_t at = buf_.size();
    attr(type, nullptr, 0);
    return at;
  }
  void endNest(size_t at) {
    auto len = static_cast<uint16_t>(buf_.size() - at);
    std::memcpy(buf_.data() + at, &len, sizeof len);
  }
  std::vector<char>& finish() {
    auto len = static_cast<uint32_t>(buf_.size());
    std::memcpy(buf_.data(), &len, sizeof len);
    return buf_;
  }

 private:
  std::vector<char> buf_;
};

// Sends one request and returns the kernel's answer as an errno (0 = done).
int netlinkTransact(std::vector<char>& message) {
  UniqueFd fd(::socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE));
  if (!fd) return errno;
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  if (::sendto(fd.get(), message.data(), message.size(), 0, reinterpret_cast<sockaddr*>(&kernel), sizeof kernel) < 0) {
    return errno;
  }
  alignas(nlmsghdr) char reply[8192];
  for (;;) {
    ssize_t n = ::recv(fd.get(), reply, sizeof reply, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    for (auto* h = reinterpret_cast<nlmsghdr*>(reply); NLMSG_OK(h, static_cast<unsigned>(n)); h = NLMSG_NEXT(h, n)) {
      if (h->nlmsg_type == NLMSG_ERROR) return -reinterpret_cast<nlmsgerr*>(NLMSG_DATA(h))->error;
    }
  }
}

// veth host_name <-> eth0, the latter created straight in the network namespace of pid.
int createVeth(const std::string& host_name, pid_t pid) {
  NetlinkMessage m(RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL);
  ifinfomsg info{};
  info.ifi_family = AF_UNSPEC;
  m.append(&info, sizeof info);
  m.attrString(IFLA_IFNAME, host_name);
  size_t linkinfo = m.beginNest(IFLA_LINKINFO);
  m.attrString(IFLA_INFO_KIND, "veth");
  size_t data = m.beginNest(IFLA_INFO_DATA);
  size_t peer = m.beginNest(VETH_INFO_PEER);
  m.append(&info, sizeof info);
  m.attrString(IFLA_IFNAME, "eth0");
  auto ns_pid = static_cast<uint32_t>(pid);
  m.attr(IFLA_NET_NS_PID, &ns_pid, sizeof ns_pid);
  m.endNest(peer);
  m.endNest(data);
  m.endNest(linkinfo);
  return netlinkTransact(m.finish());
}

Status configureHostEnd(const std::string& name, uint32_t address, uint32_t netmask) {
  UniqueFd fd(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!fd) return Error::sys(errno, "socket");
  ifreq req{};
  std::strncpy(req.ifr_name, name.c_str(), IFNAMSIZ - 1);
  auto* sin = reinterpret_cast<sockaddr_in*>(&req.ifr_addr);
  sin->sin_family = AF_INET;
  sin->sin_addr.s_addr = htonl(address);
  if (::ioctl(fd.get(), SIOCSIFADDR, &req) < 0) return Error::sys(errno, "set address of " + name);
  sin->sin_addr.s_addr = htonl(netmask);
  if (::ioctl(fd.get(), SIOCSIFNETMASK, &req) < 0) return Error::sys(errno, "set netmask of " + name);
  // Strict reverse-path filtering: the sandbox can only send from its own address.
  DSEC_TRY(writeSysctl("/proc/sys/net/ipv4/conf/" + name + "/rp_filter", "1"));
  (void)writeSysctl("/proc/sys/net/ipv6/conf/" + name + "/disable_ipv6", "1");
  if (::ioctl(fd.get(), SIOCGIFFLAGS, &req) < 0) return Error::sys(errno, "get flags of " + name);
  req.ifr_flags = static_cast<short>(req.ifr_flags | IFF_UP);
  if (::ioctl(fd.get(), SIOCSIFFLAGS, &req) < 0) return Error::sys(errno, "bring up " + name);
  return okStatus();
}

}  // namespace

EgressNetwork::EgressNetwork(std::string subnet) : subnet_(std::move(subnet)) {}

Status EgressNetwork::parseSubnet() {
  auto slash = subnet_.find('/');
  in_addr a{};
  int len = slash == std::string::npos ? -1 : atoi(subnet_.c_str() + slash + 1);
  if (slash == std::string::npos || inet_pton(AF_INET, subnet_.substr(0, slash).c_str(), &a) != 1 || len < 8 ||
      len > 27) {
    return Error::invalid("egress subnet must be an IPv4 A.B.C.D/8..27, not '" + subnet_ + "'");
  }
  const uint32_t mask = len == 0 ? 0 : ~uint32_t{0} << (32 - len);
  base_ = ntohl(a.s_addr) & mask;
  blocks_ = (uint32_t{1} << (32 - len)) / 4;
  prefix_len_ = len;
  return okStatus();
}

Result<std::pair<uint32_t, int>> EgressNetwork::block() {
  std::lock_guard lock(mu_);
  DSEC_TRY(parseSubnet());
  return std::make_pair(base_, prefix_len_);
}

std::string EgressNetwork::supportProblem() {
  nft_ctx* ctx = nft_ctx_new(NFT_CTX_DEFAULT);
  if (ctx == nullptr) return "nftables (cannot create a context)";
  nft_ctx_buffer_output(ctx);
  nft_ctx_buffer_error(ctx);
  nft_ctx_set_dry_run(ctx, true);
  int rc = nft_run_cmd_from_buffer(ctx, ruleset("100.64.0.0/16", "100.64.0.0/28").c_str());
  std::string err = nft_ctx_get_error_buffer(ctx) != nullptr ? nft_ctx_get_error_buffer(ctx) : "";
  nft_ctx_free(ctx);
  if (rc != 0) return "nftables with inet nat and fib (" + trim(err) + ")";
  if (::access("/proc/sys/net/ipv4/ip_forward", W_OK) != 0) return "IPv4 forwarding (/proc/sys/net/ipv4/ip_forward)";
  return "";
}

Status EgressNetwork::prepare() {
  std::lock_guard lock(mu_);
  if (prepared_) return okStatus();
  DSEC_TRY(parseSubnet());
  DSEC_TRY(runNft(ruleset(subnet_, ipString(base_) + "/28")));
  auto forwarding = readFile("/proc/sys/net/ipv4/ip_forward");
  if (!forwarding.ok() || trim(*forwarding) != "1") {
    DSEC_TRY(writeSysctl("/proc/sys/net/ipv4/ip_forward", "1"));
    DSEC_LOG(kInfo, "container") << "egress: turned on IPv4 forwarding for sandbox links (dsv*)";
  }
  std::random_device rd;
  // Agents on one node start apart; the first blocks are the resolvers'.
  next_ = rd() % (blocks_ - kResolverBlocks) + kResolverBlocks;
  prepared_ = true;
  return okStatus();
}

Result<EgressLink> EgressNetwork::attach(pid_t init_pid) {
  DSEC_TRY(prepare());
  uint32_t first;
  {
    std::lock_guard lock(mu_);
    first = next_;
    next_ = next_ + 1 < blocks_ ? next_ + 1 : kResolverBlocks;
  }
  const uint32_t links = blocks_ - kResolverBlocks;
  for (uint32_t tried = 0; tried < links; ++tried) {
    const uint32_t block = (first - kResolverBlocks + tried) % links + kResolverBlocks;
    const std::string name = "dsv" + std::to_string(block);
    int err = createVeth(name, init_pid);
    if (err == EEXIST) continue;  // another sandbox has this block
    if (err != 0) return Error::sys(err, "create the sandbox's network link " + name);
    const uint32_t net = base_ + block * 4;
    DSEC_TRY(configureHostEnd(name, net + 1, 0xfffffffc));
    EgressLink link;
    link.gateway = ipString(net + 1);
    link.address = ipString(net + 2);
    return link;
  }
  return Error(ErrorCode::kResourceExhausted, "every egress address block of " + subnet_ + " is in use on this node");
}

Result<std::vector<uint32_t>> EgressNetwork::resolverAddresses() {
  DSEC_TRY(prepare());
  std::vector<uint32_t> out;
  for (uint32_t i = 1; i + 1 < kResolverBlocks * 4; ++i) out.push_back(base_ + i);
  return out;
}

Status EgressNetwork::addNodeAddress(uint32_t address) {
  constexpr int lo = 1;  // loopback is interface 1 of every network namespace
  NetlinkMessage m(RTM_NEWADDR, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL);
  ifaddrmsg info{};
  info.ifa_family = AF_INET;
  info.ifa_prefixlen = 32;
  info.ifa_scope = RT_SCOPE_UNIVERSE;
  info.ifa_index = lo;
  m.append(&info, sizeof info);
  const uint32_t net = htonl(address);
  m.attr(IFA_LOCAL, &net, sizeof net);
  m.attr(IFA_ADDRESS, &net, sizeof net);
  const int err = netlinkTransact(m.finish());
  if (err != 0 && err != EEXIST) return Error::sys(err, "add the resolver address " + ipString(address) + " to lo");
  return okStatus();
}

}  // namespace dsec::backends
