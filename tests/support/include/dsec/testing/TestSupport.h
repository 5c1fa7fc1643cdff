// Helpers shared by the C++ tests.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dsec/common/Result.h"

namespace dsec::testing {

// Empty when the test can run as root with real kernel features; otherwise why not (for GTEST_SKIP).
std::string missingRoot();
// A fresh directory under /tmp removed (recursively, never across mounts) at destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The busybox root file system of the test layers: /bin/busybox (the host's static one) with a symlink per applet,
// the usual top directories (no /sys), /etc/passwd, group and shadow (root's hash is SANDBOX-SHADOW, so a test tells
// the layer's file from the host's) and /layer-file ("from the layer"). "" when made, else what failed; the caller
// checks that /bin/busybox exists first (and skips without it).
std::string makeBusyboxRootfs(const std::string& root, const std::vector<std::string>& applets);
// That root file system (plus extra_dirs, e.g. "/sys" for a guest) in <dir>/rootfs, packed with mkfs.erofs into
// <dir>/layer.erofs; the image's path, or what failed.
Result<std::string> makeBusyboxErofs(const std::string& dir, const std::vector<std::string>& applets,
                                     const std::vector<std::string>& extra_dirs = {});

}  // namespace dsec::testing

#define ASSERT_OK(expr)                                                                     \
  do {                                                                                      \
    const auto& dsec_assert_r_ = (expr);                                                    \
    ASSERT_TRUE(dsec_assert_r_.ok()) << #expr << ": " << dsec_assert_r_.error().toString(); \
  } while (0)
#define EXPECT_OK(expr)                                                                     \
  do {                                                                                      \
    const auto& dsec_expect_r_ = (expr);                                                    \
    EXPECT_TRUE(dsec_expect_r_.ok()) << #expr << ": " << dsec_expect_r_.error().toString(); \
  } while (0)
#define ASSERT_ERROR(expr, expected_code)                                                         \
  do {                                                                                            \
    const auto& dsec_assert_r_ = (expr);                                                          \
    ASSERT_FALSE(dsec_assert_r_.ok()) << #expr << " unexpectedly succeeded";                      \
    ASSERT_EQ(dsec_assert_r_.error().code(), expected_code) << dsec_assert_r_.error().toString(); \
  } while (0)
#define DSEC_SKIP_UNLESS_ROOT()                             \
  do {                                                      \
    std::string dsec_why_ = ::dsec::testing::missingRoot(); \
    if (!dsec_why_.empty()) GTEST_SKIP() << dsec_why_;      \
  } while (0)
