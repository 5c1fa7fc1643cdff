// The node agent's part of the fncall backend: starting it over the agent's image source and container backend, and
// what the node's info says about it. Kept apart from NodeAgent.cc, which only calls in here.
#include "dsec/common/Logging.h"
#include "dsec/launcher/node/NodeAgent.h"

namespace dsec::launcher {

void NodeAgent::startFncall() {
  if (!backend_runs_processes_) {
    fncall_unavailable_ = "this node's backend runs no processes (a simulated node)";
    return;
  }
  if (!backend_ || !unavailable_reason_.empty()) {
    fncall_unavailable_ = unavailable_reason_.empty() ? "no container backend" : unavailable_reason_;
    return;
  }
  auto service = NodeFncall::start(options_.fncall, options_.node_name, images_.get(), backend_.get());
  if (!service.ok()) {
    fncall_unavailable_ = service.error().message();
    DSEC_LOG(kWarn, "fncall") << "fncall unavailable: " << fncall_unavailable_ << " (calls will get 501)";
    return;
  }
  fncall_ = std::move(*service);
}

void NodeAgent::addFncallInfo(NodeInfo* info) const {
  if (fncall_) {
    info->backends.push_back(backends::BackendKind::kFncall);  // its pools and calls: fncall()->stats()
  } else {
    info->unavailable_backends[backends::BackendKind::kFncall] =
        fncall_unavailable_.empty() ? "not started" : fncall_unavailable_;
  }
}

}  // namespace dsec::launcher
