// dsec-test-python-rootfs DIR: writes the fncall test Python root file system (PythonTestImage.h) into DIR,
// for tests outside C++ (pytest) that build their own layer from it.
#include <cstdio>

#include "PythonTestImage.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  std::string missing = dsec::testing::missingPythonRootfsTools();
  if (!missing.empty()) {
    std::fprintf(stderr, "dsec-test-python-rootfs: %s\n", missing.c_str());
    return 3;
  }
  auto st = dsec::testing::writePythonRootfs(argv[1]);
  if (!st.ok()) {
    std::fprintf(stderr, "dsec-test-python-rootfs: %s\n", st.error().toString().c_str());
    return 1;
  }
  return 0;
}
