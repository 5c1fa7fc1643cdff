// The record of what a running sandbox's processes were refused.
#include "ContainerSandbox.h"

namespace dsec::backends {

Result<std::vector<Violation>> ContainerSandbox::violations() {
  DSEC_ASSIGN_OR_RETURN(Use use, acquire(false));
  return violations_->list();
}

}  // namespace dsec::backends
