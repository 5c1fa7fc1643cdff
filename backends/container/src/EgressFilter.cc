#include "EgressFilter.h"

#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <linux/magic.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <iterator>

#include "EgressMaps.h"
#include "dsec/common/Directory.h"
#include "dsec/common/Logging.h"
#include "dsec/common/Process.h"
#include "dsec/common/Strings.h"
#include "dsec_egress.skel.h"  // generated from bpf/egress.bpf.c

// The programs' decision (bpf/EgressDecision.h), here on the maps as the agent reads them.
struct DsecEgressMapFds {
  int allow;
  int never;
  int resolved;
};
#define DSEC_EGRESS_ENV const DsecEgressMapFds*
static inline int dsec_egress_allow_prefix(const DsecEgressMapFds* env, dsec_egress_allow_key* key) {
  uint8_t prefix = 0;
  return bpf_map_lookup_elem(env->allow, key, &prefix) == 0 ? prefix : -1;
}
static inline int dsec_egress_never_listed(const DsecEgressMapFds* env, dsec_egress_never_key* key) {
  uint8_t one = 0;
  return bpf_map_lookup_elem(env->never, key, &one) == 0 ? 1 : 0;
}
static inline __u64 dsec_egress_resolved_expiry(const DsecEgressMapFds* env, dsec_egress_resolved_key* key) {
  dsec_egress_resolved value{};
  return bpf_map_lookup_elem(env->resolved, key, &value) == 0 ? value.expires_boot_ns : 0;
}
static inline __u64 dsec_egress_now_boot_ns(const DsecEgressMapFds* /*env*/) {
  timespec ts{};
  clock_gettime(CLOCK_BOOTTIME, &ts);
  return static_cast<__u64>(ts.tv_sec) * 1000000000ULL + static_cast<__u64>(ts.tv_nsec);
}
#include "EgressDecision.h"

namespace dsec::backends {
namespace {

struct Attachment {
  bpf_program* (*program)(dsec_egress*);
  bpf_attach_type type;
};
const Attachment kAttachments[] = {
    {[](dsec_egress* s) { return s->progs.dsec_connect4; }, BPF_CGROUP_INET4_CONNECT},
    {[](dsec_egress* s) { return s->progs.dsec_sendmsg4; }, BPF_CGROUP_UDP4_SENDMSG},
    {[](dsec_egress* s) { return s->progs.dsec_connect6; }, BPF_CGROUP_INET6_CONNECT},
    {[](dsec_egress* s) { return s->progs.dsec_sendmsg6; }, BPF_CGROUP_UDP6_SENDMSG},
};
constexpr const char* kProgramPrefix = "dsec_";

Ip4Block block(const char* dotted, int prefix_len) {
  in_addr a{};
  inet_pton(AF_INET, dotted, &a);
  return {ntohl(a.s_addr), prefix_len};
}

// Never reachable whatever the policy, besides the node's own addresses: "this network", link-local (cloud
// metadata), multicast, broadcast.
const Ip4Block kAlwaysNever[] = {block("0.0.0.0", 8), block("169.254.0.0", 16), block("224.0.0.0", 4),
                                 block("255.255.255.255", 32)};

std::string ip4Text(uint32_t host_order) {
  char buf[INET_ADDRSTRLEN] = {};
  uint32_t net = htonl(host_order);
  inet_ntop(AF_INET, &net, buf, sizeof buf);
  return buf;
}

uint32_t maskOf(int prefix_len) { return prefix_len == 0 ? 0 : ~uint32_t{0} << (32 - prefix_len); }

bool covers(const std::vector<Ip4Block>& blocks, uint32_t address) {
  return std::any_of(blocks.begin(), blocks.end(), [address](const Ip4Block& b) {
    return (address & maskOf(b.prefix_len)) == (b.address & maskOf(b.prefix_len));
  });
}

// The node's IPv4 addresses but loopback's 127/8 (a sandbox's 127/8 is its own loopback).
Result<std::vector<uint32_t>> nodeAddresses() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return Error::sys(errno, "list the node's addresses");
  std::vector<uint32_t> addresses;
  for (ifaddrs* it = list; it != nullptr; it = it->ifa_next) {
    if (it->ifa_addr == nullptr || it->ifa_addr->sa_family != AF_INET) continue;
    const uint32_t address = ntohl(reinterpret_cast<sockaddr_in*>(it->ifa_addr)->sin_addr.s_addr);
    if ((address >> 24) != 127) addresses.push_back(address);
  }
  freeifaddrs(list);
  return addresses;
}

// A netlink socket told of every IPv4 address added to or removed from the node.
Result<UniqueFd> addressEvents() {
  UniqueFd fd(::socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC | SOCK_NONBLOCK, NETLINK_ROUTE));
  if (!fd) return Error::sys(errno, "open a netlink socket for the node's address changes");
  sockaddr_nl local{};
  local.nl_family = AF_NETLINK;
  local.nl_groups = RTMGRP_IPV4_IFADDR;
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&local), sizeof local) != 0) {
    return Error::sys(errno, "subscribe to the node's address changes");
  }
  return fd;
}

double bootSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_BOOTTIME, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

dsec_egress_allow_key allowKey(uint64_t cookie, uint32_t generation, const EgressRule& rule) {
  dsec_egress_allow_key key{};
  key.prefixlen = DSEC_EGRESS_ALLOW_FIXED_BITS + static_cast<uint32_t>(rule.prefix_len);
  key.netns_cookie = cookie;
  key.generation = generation;
  key.port = htons(rule.port);
  uint32_t ip4 = 0;  // network order, as the rule holds it
  std::memcpy(&ip4, rule.address.data(), 4);
  key.ip4 = ip4;
  return key;
}

}  // namespace

Result<std::string> EgressFilter::cgroup2DirFor(int cgroup_version, const std::string& parent,
                                                const std::string& root) {
  const std::string base = cgroup_version == 2 ? root : root + "/unified";
  struct statfs fs {};
  if (statfs(base.c_str(), &fs) != 0 || fs.f_type != CGROUP2_SUPER_MAGIC) {
    return Error(ErrorCode::kUnsupported, "egress policies need a cgroup v2 hierarchy for BPF programs, and " + base +
                                              " is not one (mount cgroup2 there, as systemd's hybrid mode does)");
  }
  return base + "/" + parent;
}

Result<std::unique_ptr<EgressFilter>> EgressFilter::start(ViolationSink sink) {
  std::unique_ptr<EgressFilter> filter(new EgressFilter());
  filter->sink_ = std::move(sink);
  filter->skeleton_ = dsec_egress__open_and_load();
  if (filter->skeleton_ == nullptr) {
    return Error(ErrorCode::kUnsupported, "the kernel refused the egress BPF programs (cgroup connect/sendmsg hooks)",
                 errno);
  }
  // The node's own namespace (ours): its processes are not sandboxes. Set before the programs are attached
  // anywhere: from then on they let nothing else out without a policy.
  DSEC_ASSIGN_OR_RETURN(uint64_t own, ownNetnsCookie());
  const uint32_t zero = 0;
  dsec_egress_config config{own};
  if (bpf_map_update_elem(bpf_map__fd(filter->skeleton_->maps.config), &zero, &config, BPF_ANY) != 0) {
    return Error::sys(errno, "configure the egress filter");
  }
  for (const auto& a : kAttachments) {
    bpf_prog_info info{};
    uint32_t len = sizeof info;
    if (bpf_obj_get_info_by_fd(bpf_program__fd(a.program(filter->skeleton_)), &info, &len) == 0) {
      filter->program_ids_.push_back(info.id);
    }
  }
  // Subscribed before the first refresh: an address that comes after it is announced.
  DSEC_ASSIGN_OR_RETURN(filter->address_events_, addressEvents());
  DSEC_TRY(filter->refreshNever());
  std::vector<BpfEventThread::Watch> also;
  also.push_back({filter->address_events_.get(), [f = filter.get()] { f->onAddressChange(); }});
  DSEC_ASSIGN_OR_RETURN(
      filter->events_,
      BpfEventThread::start(
          "egress filter", bpf_map__fd(filter->skeleton_->maps.events),
          [f = filter.get()](const void* data, size_t size) { f->deliver(data, size); }, std::move(also)));
  return filter;
}

Status EgressFilter::attachTo(const std::string& dir) {
  DSEC_TRY(makeDirs(dir, 0755));
  UniqueFd cgroup(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!cgroup) return Error::sys(errno, "open " + dir);
  for (const auto& a : kAttachments) {
    if (bpf_prog_attach(bpf_program__fd(a.program(skeleton_)), cgroup.get(), a.type, BPF_F_ALLOW_MULTI) != 0) {
      const int err = errno;
      for (const auto& undo : kAttachments) {
        (void)bpf_prog_detach2(bpf_program__fd(undo.program(skeleton_)), cgroup.get(), undo.type);
      }
      return Error::sys(err, "attach the egress BPF programs to " + dir);
    }
  }
  std::lock_guard lock(mu_);
  attached_.push_back(dir);
  return okStatus();
}

void EgressFilter::forgetDir(const std::string& dir) {
  std::lock_guard lock(mu_);
  attached_.erase(std::remove(attached_.begin(), attached_.end(), dir), attached_.end());
}

namespace {

// Detaches the programs named dsec_* on the directory, except those whose ids are in keep.
Status detachDsecPrograms(int cgroup_fd, const std::vector<uint32_t>& keep) {
  for (const auto& a : kAttachments) {
    uint32_t ids[64] = {};
    uint32_t count = 64;
    uint32_t flags = 0;
    if (bpf_prog_query(cgroup_fd, a.type, 0, &flags, ids, &count) != 0) {
      return Error::sys(errno, "list the BPF programs on a sandboxes' cgroup");
    }
    for (uint32_t i = 0; i < count; ++i) {
      if (std::find(keep.begin(), keep.end(), ids[i]) != keep.end()) continue;
      UniqueFd prog(bpf_prog_get_fd_by_id(ids[i]));
      if (!prog) continue;
      bpf_prog_info info{};
      uint32_t len = sizeof info;
      if (bpf_obj_get_info_by_fd(prog.get(), &info, &len) != 0) continue;
      if (std::strncmp(info.name, kProgramPrefix, std::strlen(kProgramPrefix)) != 0) continue;  // not ours
      (void)bpf_prog_detach2(prog.get(), cgroup_fd, a.type);
    }
  }
  return okStatus();
}

}  // namespace

Status EgressFilter::detachOthersOn(const std::string& dir) {
  UniqueFd cgroup(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!cgroup) return errno == ENOENT ? okStatus() : Error::sys(errno, "open " + dir);
  return detachDsecPrograms(cgroup.get(), program_ids_);
}

bool EgressFilter::removeIfEmpty(const std::string& dir) {
  auto procs = readFile(dir + "/cgroup.procs");
  if (!procs.ok() || !trim(*procs).empty()) return false;
  UniqueFd cgroup(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (cgroup) (void)detachDsecPrograms(cgroup.get(), {});
  return ::rmdir(dir.c_str()) == 0;
}

EgressFilter::~EgressFilter() {
  events_.reset();
  std::vector<std::string> attached;
  bool idle = false;
  {
    std::lock_guard lock(mu_);
    idle = sandboxes_.empty();
    attached = attached_;
  }
  // With sandboxes left the programs stay attached: they go on enforcing the last policies until the next agent
  // takes over. With none, nothing needs them.
  if (idle && skeleton_ != nullptr) {
    for (const auto& dir : attached) {
      UniqueFd cgroup(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
      if (!cgroup) continue;
      for (const auto& a : kAttachments) {
        (void)bpf_prog_detach2(bpf_program__fd(a.program(skeleton_)), cgroup.get(), a.type);
      }
    }
  }
  if (skeleton_ != nullptr) dsec_egress__destroy(skeleton_);
}

Status EgressFilter::refreshNever() {
  std::lock_guard lock(never_mu_);
  std::vector<Ip4Block> blocks(std::begin(kAlwaysNever), std::end(kAlwaysNever));
  blocks.insert(blocks.end(), extra_never_.begin(), extra_never_.end());
  DSEC_ASSIGN_OR_RETURN(std::vector<uint32_t> addresses, nodeAddresses());
  for (uint32_t address : addresses) {
    if (!covers(blocks, address)) blocks.push_back({address, 32});
  }
  std::set<std::pair<uint32_t, uint32_t>> wanted;
  for (const auto& b : blocks) wanted.emplace(static_cast<uint32_t>(b.prefix_len), b.address & maskOf(b.prefix_len));
  const int fd = bpf_map__fd(skeleton_->maps.never);
  // New entries first, then the ones that left: a refresh never opens, even for a moment, what stays closed.
  for (const auto& [prefix_len, address] : wanted) {
    if (never_keys_.count({prefix_len, address}) != 0) continue;
    dsec_egress_never_key key{prefix_len, htonl(address)};
    const uint8_t one = 1;
    if (bpf_map_update_elem(fd, &key, &one, BPF_ANY) != 0) {
      return Error::sys(errno, "close " + ip4Text(address) + "/" + std::to_string(prefix_len) + " to sandboxes");
    }
    never_keys_.emplace(prefix_len, address);
  }
  for (auto it = never_keys_.begin(); it != never_keys_.end();) {
    if (wanted.count(*it) != 0) {
      ++it;
      continue;
    }
    dsec_egress_never_key key{it->first, htonl(it->second)};
    (void)bpf_map_delete_elem(fd, &key);
    it = never_keys_.erase(it);
  }
  return okStatus();
}

void EgressFilter::onAddressChange() {
  // Drain every message: what changed does not matter, the refresh reads the addresses whole.
  char buf[8192];
  bool overrun = false;
  while (true) {
    const ssize_t n = ::recv(address_events_.get(), buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) continue;
    if (n < 0 && errno == EINTR) continue;
    overrun = n < 0 && errno == ENOBUFS;  // messages lost: the refresh below reads the whole state anyway
    if (!overrun) break;
  }
  if (auto refreshed = refreshNever(); !refreshed.ok()) {
    DSEC_LOG(kWarn, "container") << "egress filter: the node's addresses changed and the never-reachable set could "
                                    "not follow: "
                                 << refreshed.error().toString();
  }
}

Status EgressFilter::setNever(const std::vector<Ip4Block>& extra) {
  {
    std::lock_guard lock(never_mu_);
    extra_never_ = extra;
  }
  return refreshNever();
}

void EgressFilter::eraseEntries(uint64_t netns_cookie, const SandboxPolicy& policy) {
  const int allow_fd = bpf_map__fd(skeleton_->maps.allow);
  for (const auto& rule : policy.policy.rules) {
    if (rule.isDomain()) continue;
    auto key = allowKey(netns_cookie, policy.generation, rule);
    (void)bpf_map_delete_elem(allow_fd, &key);
  }
  const int resolved_fd = bpf_map__fd(skeleton_->maps.resolved);
  for (const auto& [where, expiry] : policy.resolved) {
    dsec_egress_resolved_key key;
    std::memset(&key, 0, sizeof key);
    key.netns_cookie = netns_cookie;
    key.generation = policy.generation;
    key.ip4 = htonl(where.first);
    key.port = htons(where.second);
    (void)bpf_map_delete_elem(resolved_fd, &key);
  }
}

Status EgressFilter::setPolicy(uint64_t netns_cookie, const EgressPolicy& policy, uint32_t resolver_ip4,
                               uint32_t own_ip4) {
  std::lock_guard lock(mu_);
  SandboxPolicy next;
  auto found = sandboxes_.find(netns_cookie);
  next.generation = found == sandboxes_.end() ? 1 : found->second.generation + 1;
  next.policy = policy;
  const int allow_fd = bpf_map__fd(skeleton_->maps.allow);
  for (const auto& rule : policy.rules) {
    if (rule.isDomain()) continue;
    auto key = allowKey(netns_cookie, next.generation, rule);
    const auto prefix = static_cast<uint8_t>(rule.prefix_len);
    if (bpf_map_update_elem(allow_fd, &key, &prefix, BPF_ANY) != 0) {
      const int err = errno;
      eraseEntries(netns_cookie, next);
      return Error::sys(err, "install egress rule " + rule.text);
    }
  }
  // The switch: from this write on, every connect and send sees the new generation's entries only.
  dsec_egress_sandbox entry{next.generation, htonl(resolver_ip4), htonl(own_ip4), 0};
  if (bpf_map_update_elem(bpf_map__fd(skeleton_->maps.sandboxes), &netns_cookie, &entry, BPF_ANY) != 0) {
    const int err = errno;
    eraseEntries(netns_cookie, next);
    return Error::sys(err, "install the sandbox's egress policy");
  }
  if (found != sandboxes_.end()) eraseEntries(netns_cookie, found->second);
  sandboxes_[netns_cookie] = std::move(next);
  return okStatus();
}

Status EgressFilter::installResolved(uint64_t netns_cookie, SandboxPolicy& policy, uint32_t ip4, uint16_t port,
                                     double ttl_seconds) {
  dsec_egress_resolved_key key;
  std::memset(&key, 0, sizeof key);  // padding too: the map compares every byte
  key.netns_cookie = netns_cookie;
  key.generation = policy.generation;
  key.ip4 = htonl(ip4);
  key.port = htons(port);
  const double now = bootSeconds();
  double expiry = now + ttl_seconds;
  auto known = policy.resolved.find({ip4, port});
  if (known == policy.resolved.end() && policy.resolved.size() >= kMaxResolvedPerSandbox) {
    // A sandbox that resolves ever new names (its own wildcard domain) makes room in its own entries only: the
    // expired ones, else the one that runs out first. The map is the node's; no sandbox may fill it for the others.
    dropResolved(netns_cookie, policy, now);
  }
  if (known != policy.resolved.end()) expiry = std::max(expiry, known->second);  // a shorter answer never cuts
  dsec_egress_resolved value{static_cast<uint64_t>(expiry * 1e9)};
  if (bpf_map_update_elem(bpf_map__fd(skeleton_->maps.resolved), &key, &value, BPF_ANY) != 0) {
    return Error::sys(errno, "allow resolved address " + ip4Text(ip4));
  }
  policy.resolved[{ip4, port}] = expiry;
  return okStatus();
}

void EgressFilter::dropResolved(uint64_t netns_cookie, SandboxPolicy& policy, double now) {
  auto forget = [&](std::map<std::pair<uint32_t, uint16_t>, double>::iterator it) {
    dsec_egress_resolved_key key;
    std::memset(&key, 0, sizeof key);
    key.netns_cookie = netns_cookie;
    key.generation = policy.generation;
    key.ip4 = htonl(it->first.first);
    key.port = htons(it->first.second);
    (void)bpf_map_delete_elem(bpf_map__fd(skeleton_->maps.resolved), &key);
    return policy.resolved.erase(it);
  };
  for (auto it = policy.resolved.begin(); it != policy.resolved.end();) {
    it = it->second <= now ? forget(it) : std::next(it);
  }
  if (policy.resolved.size() < kMaxResolvedPerSandbox) return;
  auto soonest = std::min_element(policy.resolved.begin(), policy.resolved.end(),
                                  [](const auto& a, const auto& b) { return a.second < b.second; });
  forget(soonest);
}

Status EgressFilter::allowResolved(uint64_t netns_cookie, uint32_t ip4, uint16_t port, double ttl_seconds) {
  std::lock_guard lock(mu_);
  auto found = sandboxes_.find(netns_cookie);
  if (found == sandboxes_.end()) return Error::notFound("no egress policy for this network namespace");
  return installResolved(netns_cookie, found->second, ip4, port, ttl_seconds);
}

std::optional<NameVerdict> EgressFilter::verdictFor(uint64_t netns_cookie, const std::string& name) {
  std::lock_guard lock(mu_);
  auto found = sandboxes_.find(netns_cookie);
  if (found == sandboxes_.end()) return std::nullopt;
  return found->second.policy.verdictFor(name);
}

Status EgressFilter::allowResolvedName(uint64_t netns_cookie, const std::string& name, uint32_t ip4,
                                       double ttl_seconds) {
  std::lock_guard lock(mu_);
  auto found = sandboxes_.find(netns_cookie);
  if (found == sandboxes_.end()) return Error::notFound("no egress policy for this network namespace");
  for (const auto& rule : found->second.policy.rules) {
    if (!rule.matchesName(name)) continue;
    DSEC_TRY(installResolved(netns_cookie, found->second, ip4, rule.port, ttl_seconds));
  }
  return okStatus();
}

void EgressFilter::remove(uint64_t netns_cookie) {
  std::lock_guard lock(mu_);
  auto found = sandboxes_.find(netns_cookie);
  if (found == sandboxes_.end()) return;
  (void)bpf_map_delete_elem(bpf_map__fd(skeleton_->maps.sandboxes), &netns_cookie);
  eraseEntries(netns_cookie, found->second);
  sandboxes_.erase(found);
}

bool EgressFilter::allows(uint64_t netns_cookie, uint32_t ip4, uint16_t port) const {
  dsec_egress_sandbox sandbox{};
  if (bpf_map_lookup_elem(bpf_map__fd(skeleton_->maps.sandboxes), &netns_cookie, &sandbox) != 0) return true;
  const DsecEgressMapFds maps{bpf_map__fd(skeleton_->maps.allow), bpf_map__fd(skeleton_->maps.never),
                              bpf_map__fd(skeleton_->maps.resolved)};
  return dsec_egress_decide4(&maps, netns_cookie, &sandbox, htonl(ip4), htons(port)) == DSEC_EGRESS_ALLOWED;
}

void EgressFilter::deliver(const void* data, size_t size) {
  if (size < sizeof(dsec_egress_event) || !sink_) return;
  dsec_egress_event e{};
  std::memcpy(&e, data, sizeof e);
  Violation v;
  v.time_unix = static_cast<double>(time(nullptr)) - (bootSeconds() - static_cast<double>(e.time_boot_ns) / 1e9);
  v.kind = ViolationKind::kConnect;
  const uint16_t port = ntohs(e.port);
  if (e.reason == DSEC_EGRESS_IPV6) {
    char buf[INET6_ADDRSTRLEN] = {};
    inet_ntop(AF_INET6, e.ip6, buf, sizeof buf);
    v.target = "[" + std::string(buf) + "]:" + std::to_string(port);
  } else {
    v.target = ip4Text(ntohl(e.ip4)) + ":" + std::to_string(port);
  }
  const char* proto = e.sock_type == SOCK_STREAM ? "tcp" : e.sock_type == SOCK_DGRAM ? "udp" : "socket";
  const char* op = e.op == 0 ? "connect" : "send";
  const char* why = e.reason == DSEC_EGRESS_NODE   ? "the node, link-local and the fleet are never reachable"
                    : e.reason == DSEC_EGRESS_IPV6 ? "no IPv6 egress"
                                                   : "not in the egress policy";
  v.detail = std::string(proto) + " " + op + " refused: " + why;
  sink_(e.netns_cookie, std::move(v));
}

}  // namespace dsec::backends
