// Fault injection for tests: a named point fails when the fault registry names it.
// Tests (and only tests) arm a point with armFault("container.mount_overlay") or DSEC_FAULT=name in the
// environment of the process; the code under test calls checkFault("...") at each step that can fail, so
// a test can prove that a failure at any step leaves nothing behind.
#pragma once

#include <string>

#include "dsec/common/Result.h"

namespace dsec {

void armFault(const std::string& point);  // arm one point (empty string disarms all)
std::string armedFault();                 // the armed point, or "" (DSEC_FAULT is read once at first use)
Status checkFault(const char* point);     // an error naming the point if it is armed, else ok

}  // namespace dsec
