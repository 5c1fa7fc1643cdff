// Helpers shared by the C++ tests.
#pragma once

#include <gtest/gtest.h>

#include <string>

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
