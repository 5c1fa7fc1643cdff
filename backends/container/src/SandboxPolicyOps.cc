// A running sandbox's protected paths, changed in place, and the record of what was refused.
#include "ContainerSandbox.h"

namespace dsec::backends {

Status ContainerSandbox::setProtectedPaths(const std::vector<std::string>& paths) {
  DSEC_ASSIGN_OR_RETURN(std::vector<std::string> normal, parseProtectedPaths(paths));
  (void)normal;
  DSEC_ASSIGN_OR_RETURN(Use use, acquire(false));
  return Error(ErrorCode::kUnsupported, "protected paths are not built yet");
}

Result<std::vector<Violation>> ContainerSandbox::violations() {
  DSEC_ASSIGN_OR_RETURN(Use use, acquire(false));
  return violations_->list();
}

}  // namespace dsec::backends
