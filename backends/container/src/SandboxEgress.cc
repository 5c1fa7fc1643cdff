// A sandbox's egress policy: put in force at create (and again on adoption), replaced while it runs, forgotten when
// it is destroyed. The kernel side is EgressFilter.
#include <arpa/inet.h>

#include <cstring>

#include "ContainerSandbox.h"
#include "dsec/common/Logging.h"

namespace dsec::backends {

ContainerShared::~ContainerShared() {
  egress_filter.reset();  // its event thread delivers into logs_by_netns
  filewatch.reset();
}

Result<EgressFilter*> startedEgressFilter(ContainerShared& shared) {
  std::lock_guard lock(shared.egress_mu);
  if (shared.egress_filter) return shared.egress_filter.get();
  DSEC_ASSIGN_OR_RETURN(std::string dir,
                        EgressFilter::attachDirFor(shared.cgroups->version(), shared.options.cgroup_parent));
  auto sink = [&shared](uint64_t netns_cookie, Violation violation) {
    std::shared_ptr<ViolationLog> log;
    {
      std::lock_guard logs(shared.logs_mu);
      auto found = shared.logs_by_netns.find(netns_cookie);
      if (found != shared.logs_by_netns.end()) log = found->second.lock();
    }
    if (log) log->record(std::move(violation));
  };
  DSEC_ASSIGN_OR_RETURN(std::unique_ptr<EgressFilter> filter, EgressFilter::start(dir, sink));
  if (shared.cgroups->version() == 1) {
    // On v1 the sandboxes' own cgroups are not under the programs' directory: every command and process is
    // started by the spawner, so it goes there (and they with it).
    if (!shared.spawner) return Error(ErrorCode::kUnsupported, "egress policies need the command spawner");
    DSEC_TRY(shared.spawner->placeIn(dir));
  }
  std::vector<Ip4Block> never;
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
  DSEC_LOG(kInfo, "container") << "egress policies enforced by BPF programs on " << dir;
  shared.egress_filter = std::move(filter);
  return shared.egress_filter.get();
}

Status ContainerSandbox::enforceEgress(const EgressPolicy& policy, uint32_t resolver_ip4) {
  std::lock_guard lock(policy_mu_);
  DSEC_ASSIGN_OR_RETURN(EgressFilter * filter, startedEgressFilter(*shared_));
  DSEC_ASSIGN_OR_RETURN(uint64_t cookie, netnsCookieOf(init_.pidfd.get()));
  {
    std::lock_guard logs(shared_->logs_mu);
    shared_->logs_by_netns[cookie] = violations_;
  }
  DSEC_TRY(filter->setPolicy(cookie, policy, resolver_ip4));
  netns_cookie_ = cookie;
  resolver_ip4_ = resolver_ip4;
  std::lock_guard state(mu_);
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
  DSEC_TRY(filter->setPolicy(netns_cookie_, policy, resolver_ip4_));
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
    if (shared_->egress_filter) shared_->egress_filter->remove(netns_cookie_);
  }
  std::lock_guard logs(shared_->logs_mu);
  shared_->logs_by_netns.erase(netns_cookie_);
  netns_cookie_ = 0;
}

}  // namespace dsec::backends
