// Shared by the fs3 tests: sample trees with everything a layer must keep, and mount-table probes.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <random>
#include <string>

#include "dsec/common/Process.h"
#include "dsec/common/Strings.h"
#include "dsec/fs3/MountInfo.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::fs3::testing {

constexpr time_t kSampleMtime = 1500000000;  // 2017-07-14, far from any build time

inline Status writeSample(const std::string& path, const std::string& text, int mode = 0644) {
  DSEC_TRY(writeFile(path, text));
  if (::chmod(path.c_str(), mode) != 0) return Error::sys(errno, "chmod " + path);
  return okStatus();
}

// An overlay whiteout (char device 0/0) at path.
inline Status makeWhiteout(const std::string& path) {
  if (::mknod(path.c_str(), S_IFCHR | 0000, makedev(0, 0)) != 0) return Error::sys(errno, "mknod " + path);
  return okStatus();
}

// An overlay opaque directory (trusted.overlay.opaque=y) at path.
inline Status makeOpaqueDir(const std::string& path) {
  DSEC_TRY(makeDirs(path, 0755));
  if (::setxattr(path.c_str(), "trusted.overlay.opaque", "y", 1, 0) != 0) {
    return Error::sys(errno, "setxattr " + path);
  }
  return okStatus();
}

// hello.txt, sub/file.txt, link -> hello.txt, whiteout "gone" (char 0/0), opaque dir "opaque" holding
// inner.txt, secret.sh with mode 0750 owned by 1234:5678, and hello.txt's mtime set to kSampleMtime.
inline Status makeSampleTree(const std::string& dir) {
  DSEC_TRY(makeDirs(dir + "/sub", 0755));
  DSEC_TRY(writeSample(dir + "/hello.txt", "hello\n"));
  DSEC_TRY(writeSample(dir + "/sub/file.txt", "in sub\n"));
  if (::symlink("hello.txt", (dir + "/link").c_str()) != 0) return Error::sys(errno, "symlink");
  DSEC_TRY(makeWhiteout(dir + "/gone"));
  DSEC_TRY(makeOpaqueDir(dir + "/opaque"));
  DSEC_TRY(writeSample(dir + "/opaque/inner.txt", "inner\n"));
  DSEC_TRY(writeSample(dir + "/secret.sh", "#!/bin/sh\necho secret\n", 0750));
  if (::chown((dir + "/secret.sh").c_str(), 1234, 5678) != 0) return Error::sys(errno, "chown");
  struct timespec times[2] = {{kSampleMtime, 0}, {kSampleMtime, 0}};
  if (::utimensat(AT_FDCWD, (dir + "/hello.txt").c_str(), times, 0) != 0) return Error::sys(errno, "utimensat");
  return okStatus();
}

// n bytes of a seeded pseudo-random stream: the same seed, the same bytes (chunks that must or must not match).
inline std::string randomBytes(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(gen());
  return s;
}

inline int countMountsAt(const std::string& path) {
  auto mounts = readMountInfo();
  if (!mounts.ok()) return -1;
  int n = 0;
  for (const auto& m : *mounts) n += m.mount_point == path ? 1 : 0;
  return n;
}

inline std::string sha256sumOf(const std::string& path) {
  auto out = runCommandChecked({"sha256sum", path});
  if (!out.ok()) return "sha256sum failed: " + out.error().message();
  return out->substr(0, out->find(' '));
}

// Why fs3 tests with real images cannot run here, or "".
inline std::string missingForImages() {
  std::string why = ::dsec::testing::missingRoot();
  if (!why.empty()) return why;
  if (findProgram("mkfs.erofs").empty()) return "mkfs.erofs not installed (apt-get install erofs-utils)";
  return "";
}

}  // namespace dsec::fs3::testing

#define DSEC_SKIP_UNLESS_IMAGES()                                     \
  do {                                                                \
    std::string dsec_why_ = ::dsec::fs3::testing::missingForImages(); \
    if (!dsec_why_.empty()) GTEST_SKIP() << dsec_why_;                \
  } while (0)
