// A running sandbox's egress policy and protected paths, changed in place, and the record of what was refused.
#include "ContainerSandbox.h"

namespace dsec::backends {

Status ContainerSandbox::setEgress(const EgressPolicy& policy) {
  (void)policy;
  DSEC_ASSIGN_OR_RETURN(Use use, acquire(false));
  if (spec_.network != NetworkMode::kEgress) {
    return Error(ErrorCode::kConflict, "sandbox " + spec_.id +
                                           " was created without a network link (network \"none\"); create it with "
                                           "network {\"egress\": [...]} to change its policy later");
  }
  return Error(ErrorCode::kUnsupported, "changing the egress policy of a running sandbox is not built yet");
}

Result<std::vector<Violation>> ContainerSandbox::violations() {
  DSEC_ASSIGN_OR_RETURN(Use use, acquire(false));
  return violations_->list();
}

}  // namespace dsec::backends
