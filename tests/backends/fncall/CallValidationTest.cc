// Request validation: every bad field is kInvalidArgument naming the field (no root needed).
#include <gtest/gtest.h>

#include "dsec/backends/fncall/FunctionService.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::backends::fncall {
namespace {

CallRequest good() {
  CallRequest r;
  r.code = "print(1)";
  return r;
}

void expectInvalid(const CallRequest& r, const std::string& field) {
  Status st = validateCallRequest(r);
  ASSERT_FALSE(st.ok()) << "expected '" << field << "' to be rejected";
  EXPECT_EQ(st.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.error().message().find("'" + field), std::string::npos) << st.error().message();
}

TEST(CallValidationTest, AcceptsAGoodRequest) {
  EXPECT_OK(validateCallRequest(good()));
  CallRequest r = good();
  r.files = {{"a.txt", "x"}, {"dir/b.py", "y"}, {"dir/sub/c", ""}, {".hidden", "z"}, {"a..b", "w"}};
  EXPECT_OK(validateCallRequest(r));
}

TEST(CallValidationTest, RejectsBadFields) {
  CallRequest r = good();
  r.code = std::string(kMaxCodeBytes + 1, 'x');
  expectInvalid(r, "code");
  r = good();
  r.code = std::string("print(1)\0", 9);
  expectInvalid(r, "code");
  r = good();
  r.stdin_data = std::string(kMaxStdinBytes + 1, 'x');
  expectInvalid(r, "stdin");
  for (double t : {0.0, -1.0, kMaxTimeoutSeconds + 1, std::nan("")}) {
    r = good();
    r.timeout_seconds = t;
    expectInvalid(r, "timeout");
  }
  for (int64_t m : {int64_t{0}, kMinMemoryBytes - 1, kMaxMemoryBytes + 1}) {
    r = good();
    r.memory_bytes = m;
    expectInvalid(r, "memory");
  }
  r = good();
  r.output_cap = -1;
  expectInvalid(r, "output_cap");
}

TEST(CallValidationTest, RejectsFilePathsOutsideTheWorkingDirectory) {
  for (const char* bad : {"", "/etc/passwd", "../x", "a/../../x", "a/..", "./a", "a//b", "a/", "a/./b"}) {
    CallRequest r = good();
    r.files = {{bad, "x"}};
    expectInvalid(r, "files");
  }
  CallRequest r = good();
  r.files = {{std::string("a\0b", 3), "x"}};
  expectInvalid(r, "files");
  r.files = {{std::string(kMaxFilePathBytes + 1, 'a'), "x"}};
  expectInvalid(r, "files");
  r.files = {{"a", "x"}, {"a/b", "y"}};  // "a" cannot be both a file and a directory
  expectInvalid(r, "files");
  r.files = {{"big1", std::string(kMaxFileBytes / 2 + 1, 'x')}, {"big2", std::string(kMaxFileBytes / 2 + 1, 'x')}};
  expectInvalid(r, "files");
}

TEST(CallValidationTest, Languages) {
  EXPECT_EQ(*parseLanguage("python"), Language::kPython);
  EXPECT_EQ(*parseLanguage("bash"), Language::kBash);
  ASSERT_ERROR(parseLanguage("ruby"), ErrorCode::kInvalidArgument);
  EXPECT_STREQ(languageName(Language::kBash), "bash");
}

}  // namespace
}  // namespace dsec::backends::fncall
