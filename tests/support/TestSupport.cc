#include "dsec/testing/TestSupport.h"

#include <unistd.h>

#include <cstdlib>

#include "dsec/common/Strings.h"

namespace dsec::testing {

std::string missingRoot() {
  if (geteuid() != 0) return "needs root (namespaces, mounts, cgroups): run the suite as root";
  return "";
}

TempDir::TempDir() {
  char tmpl[] = "/tmp/dsec-test-XXXXXX";
  const char* made = mkdtemp(tmpl);
  if (made == nullptr) std::abort();
  path_ = made;
}

TempDir::~TempDir() { (void)removeTree(path_); }

}  // namespace dsec::testing
