// A sandbox's egress policy: put in force at create (and again on adoption), replaced while it runs, forgotten when
// it is destroyed. The kernel side is EgressFilter.
#include <arpa/inet.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "ContainerSandbox.h"
#include "dsec/common/Directory.h"
#include "dsec/common/Logging.h"
#include "dsec/common/Strings.h"

namespace dsec::backends {

ContainerShared::~ContainerShared() {
  resolver.reset();       // its thread uses the filter and logs_by_netns
  egress_filter.reset();  // its event thread delivers into logs_by_netns
  filewatch.reset();
}

namespace {

std::string dottedQuad(uint32_t ip4) {
  in_addr a{htonl(ip4)};
  char buf[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &a, buf, sizeof buf);
  return buf;
}

// Where the resolver sends allowed names: the operator's choice, else the node's own resolver.
Ip4Endpoint dnsUpstream(const ContainerBackendOptions& options) {
  if (!options.dns_upstream.empty()) {
    auto parsed = parseIp4Endpoint(options.dns_upstream);  // checked when the backend was made
    return parsed.ok() ? *parsed : Ip4Endpoint{};
  }
  auto conf = readFile("/etc/resolv.conf");
  Ip4Endpoint found = conf.ok() ? firstNameserver(*conf) : Ip4Endpoint{};
  if (found.ip4 == 0) {
    DSEC_LOG(kWarn, "container") << "no IPv4 nameserver in /etc/resolv.conf: sandboxes' allowed names get SERVFAIL "
                                    "(set dns_upstream)";
  }
  return found;
}

Result<std::unique_ptr<NodeResolver>> startResolver(ContainerShared& shared, EgressFilter* filter,
                                                    const EgressFilter::ViolationSink& sink) {
  NodeResolver::Hooks hooks;
  hooks.sandbox_of = [&shared](uint32_t ip4) -> uint64_t {
    std::lock_guard logs(shared.logs_mu);
    auto found = shared.netns_by_address.find(ip4);
    return found == shared.netns_by_address.end() ? 0 : found->second;
  };
  hooks.verdict = [filter](uint64_t cookie, const std::string& name) { return filter->verdictFor(cookie, name); };
  hooks.allow = [filter](uint64_t cookie, const std::string& name, uint32_t ip4, double ttl) {
    return filter->allowResolvedName(cookie, name, ip4, ttl);
  };
  hooks.report = sink;
  DSEC_ASSIGN_OR_RETURN(std::vector<uint32_t> addresses, shared.egress->resolverAddresses());
  return NodeResolver::start(addresses, EgressNetwork::addNodeAddress, dnsUpstream(shared.options), std::move(hooks));
}

}  // namespace

uint32_t resolverAddress(ContainerShared& shared) {
  std::lock_guard lock(shared.egress_mu);
  return shared.resolver ? shared.resolver->address() : 0;
}

Result<EgressFilter*> startedEgressFilter(ContainerShared& shared) {
  std::lock_guard lock(shared.egress_mu);
  if (shared.egress_filter) return shared.egress_filter.get();
  DSEC_ASSIGN_OR_RETURN(std::string base,
                        EgressFilter::cgroup2DirFor(shared.cgroups->version(), shared.options.cgroup_parent));
  auto sink = [&shared](uint64_t netns_cookie, Violation violation) {
    std::shared_ptr<ViolationLog> log;
    {
      std::lock_guard logs(shared.logs_mu);
      auto found = shared.logs_by_netns.find(netns_cookie);
      if (found != shared.logs_by_netns.end()) log = found->second.lock();
    }
    if (log) log->record(std::move(violation));
  };
  DSEC_ASSIGN_OR_RETURN(std::unique_ptr<EgressFilter> filter, EgressFilter::start(sink));
  std::string where = base + "/<sandbox>";
  if (shared.cgroups->version() == 1) {
    // On v1 the sandboxes' own cgroups are in other hierarchies: every command and process is started by the
    // spawner, so the programs go on a directory of this agent's own and the spawner into it (what it starts
    // with it). Another agent on the same parent (a layer build beside a node) has its own directory.
    if (!shared.spawner) return Error(ErrorCode::kUnsupported, "egress policies need the command spawner");
    const std::string dir = base + "/agent-" + std::to_string(getpid()) + "-" + randomHex(4);
    DSEC_TRY(filter->attachTo(dir));
    if (auto placed = shared.spawner->placeIn(dir); !placed.ok()) {
      (void)::rmdir(dir.c_str());
      return placed.error();
    }
    shared.egress_agent_dir = dir;
    where = dir;
  }
  // The egress subnet whole: every link's node end (a node address that comes and goes with its sandbox) and every
  // other sandbox. The nftables rules close them too; here a try is refused at connect and recorded.
  DSEC_ASSIGN_OR_RETURN(auto subnet, shared.egress->block());
  std::vector<Ip4Block> never = {{subnet.first, subnet.second}};
  for (const auto& cidr : shared.options.egress_never) {
    auto rule = parseEgressRule(cidr);
    if (!rule.ok() || rule->isDomain() || rule->port != 0) {
      return Error::invalid("egress_never: \"" + cidr + "\" is not an IPv4 address block");
    }
    uint32_t net = 0;
    std::memcpy(&net, rule->address.data(), 4);
    never.push_back({ntohl(net), rule->prefix_len});
  }
  DSEC_TRY(filter->setNever(never));
  DSEC_ASSIGN_OR_RETURN(shared.resolver, startResolver(shared, filter.get(), sink));
  DSEC_LOG(kInfo, "container") << "egress policies enforced by BPF programs on " << where << "; sandboxes' resolver on "
                               << dottedQuad(shared.resolver->address()) << ":53";
  shared.egress_filter = std::move(filter);
  return shared.egress_filter.get();
}

void removeStaleEgressDirs(ContainerShared& shared) {
  std::string mine;
  {
    std::lock_guard lock(shared.egress_mu);
    mine = shared.egress_agent_dir;
  }
  auto base = EgressFilter::cgroup2DirFor(shared.cgroups->version(), shared.options.cgroup_parent);
  if (shared.cgroups->version() != 1 || !base.ok()) return;
  auto entries = listDirectory(*base);
  if (!entries.ok()) return;
  for (const auto& entry : *entries) {
    const std::string& name = entry.name;
    const std::string dir = *base + "/" + name;
    if (entry.is_dir && name.rfind("agent-", 0) == 0 && dir != mine && EgressFilter::removeIfEmpty(dir)) {
      DSEC_LOG(kDebug, "container") << "removed an earlier agent's egress directory " << dir;
    }
  }
}

namespace {

// Puts the processes of an adopted sandbox (started by an earlier agent's spawner, so under its programs) under
// this agent's: on a v1 host into this agent's directory; on v2 this agent's programs go on the sandbox's cgroup.
Status takeOverPrograms(ContainerShared& shared, Cgroup& cgroup, EgressFilter& filter) {
  if (shared.cgroups->version() == 1) {
    DSEC_ASSIGN_OR_RETURN(std::vector<pid_t> pids, cgroup.pids());
    for (pid_t pid : pids) {
      Status moved = writeFile(shared.egress_agent_dir + "/cgroup.procs", std::to_string(pid));
      if (!moved.ok() && moved.error().sysErrno() != ESRCH) return moved.error().wrap("move an adopted process");
    }
    return okStatus();
  }
  return filter.detachOthersOn(cgroup.cloneIntoPath());
}

}  // namespace

Status ContainerSandbox::enforceEgress(const EgressPolicy& policy, uint32_t address_ip4, uint32_t resolver_ip4,
                                       bool adopted) {
  std::lock_guard lock(policy_mu_);
  DSEC_ASSIGN_OR_RETURN(EgressFilter * filter, startedEgressFilter(*shared_));
  // On v2 the programs go on the sandbox's own cgroup, before its policy (and so before anything can use its link).
  if (shared_->cgroups->version() == 2) DSEC_TRY(filter->attachTo(cgroup_->cloneIntoPath()));
  DSEC_ASSIGN_OR_RETURN(uint64_t cookie, netnsCookieOf(init_.pidfd.get()));
  if (resolver_ip4 != 0 && resolver_ip4 != resolverAddress(*shared_)) {
    // Adopted from an agent that served it elsewhere (its /etc/resolv.conf names that address): serve there too
    // when the address is free (that agent is gone), else its names fail (the other resolver does not know it).
    auto reserved = shared_->egress->resolverAddresses();
    if (reserved.ok() && std::find(reserved->begin(), reserved->end(), resolver_ip4) != reserved->end()) {
      std::lock_guard egress(shared_->egress_mu);
      if (auto s = shared_->resolver->alsoServe(resolver_ip4); !s.ok()) {
        DSEC_LOG(kWarn, "container") << spec_.id << ": its resolver address is another's: " << s.error().toString();
      }
    }
  }
  {
    std::lock_guard logs(shared_->logs_mu);
    shared_->logs_by_netns[cookie] = violations_;
    if (address_ip4 != 0) shared_->netns_by_address[address_ip4] = cookie;
  }
  DSEC_TRY(filter->setPolicy(cookie, policy, resolver_ip4, address_ip4));
  if (adopted) DSEC_TRY(takeOverPrograms(*shared_, *cgroup_, *filter));
  netns_cookie_ = cookie;
  std::lock_guard state(mu_);
  address_ip4_ = address_ip4;
  resolver_ip4_ = resolver_ip4;
  egress_ = policy;
  return okStatus();
}

Status ContainerSandbox::setEgress(const EgressPolicy& policy) {
  DSEC_ASSIGN_OR_RETURN(Use use, acquire(false));
  std::lock_guard lock(policy_mu_);
  if (spec_.network != NetworkMode::kEgress || netns_cookie_ == 0) {
    return Error(ErrorCode::kConflict, "sandbox " + spec_.id +
                                           " was created without a network link (network \"none\"); create it with "
                                           "network {\"egress\": [...]} to change its policy later");
  }
  DSEC_ASSIGN_OR_RETURN(EgressFilter * filter, startedEgressFilter(*shared_));
  uint32_t own_ip4 = 0;
  {
    std::lock_guard state(mu_);
    own_ip4 = address_ip4_;
  }
  DSEC_TRY(filter->setPolicy(netns_cookie_, policy, resolver_ip4_, own_ip4));
  {
    std::lock_guard state(mu_);
    egress_ = policy;
  }
  // From here new connections see the new policy; the ones already open that it refuses are cut now, not left to
  // run out the stage.
  const uint64_t cookie = netns_cookie_;
  auto cut = cutSockets(init_.pidfd.get(),
                        [filter, cookie](uint32_t ip4, uint16_t port) { return filter->allows(cookie, ip4, port); });
  if (!cut.ok()) return cut.error().wrap("cut the connections the new egress policy of " + spec_.id + " refuses");
  if (*cut > 0) DSEC_LOG(kInfo, "container") << spec_.id << ": cut " << *cut << " connections the new policy refuses";
  return okStatus();
}

void ContainerSandbox::forgetEgress() {
  std::lock_guard lock(policy_mu_);
  if (netns_cookie_ == 0) return;
  {
    std::lock_guard egress(shared_->egress_mu);
    if (shared_->egress_filter) {
      shared_->egress_filter->remove(netns_cookie_);
      if (shared_->cgroups->version() == 2) shared_->egress_filter->forgetDir(cgroup_->cloneIntoPath());
    }
  }
  std::lock_guard logs(shared_->logs_mu);
  shared_->logs_by_netns.erase(netns_cookie_);
  auto owner = shared_->netns_by_address.find(address_ip4_);
  if (owner != shared_->netns_by_address.end() && owner->second == netns_cookie_) {
    shared_->netns_by_address.erase(owner);
  }
  netns_cookie_ = 0;
}

}  // namespace dsec::backends
