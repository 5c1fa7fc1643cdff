// Validation of POST /v1/call bodies: defaults, every field, and a clear message naming the field for each
// kind of bad input.
#include <gtest/gtest.h>

#include "dsec/launcher/api/CallRequests.h"
#include "dsec/launcher/api/Requests.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::launcher {
namespace {

using backends::fncall::Language;
constexpr int64_t kNodeMemory = 8LL << 30;

Result<backends::fncall::CallRequest> parse(const std::string& body) {
  auto j = parseJsonObject(body);
  if (!j.ok()) return j.error();
  return parseCallRequest(*j, kNodeMemory);
}

void expectInvalid(const std::string& body, const std::string& mention) {
  auto r = parse(body);
  ASSERT_FALSE(r.ok()) << body;
  EXPECT_EQ(r.error().code(), ErrorCode::kInvalidArgument) << r.error().toString();
  EXPECT_NE(r.error().message().find(mention), std::string::npos) << body << " -> " << r.error().message();
}

TEST(CallRequest, DefaultsFromCodeOnly) {
  auto r = parse(R"j({"code": "print(1)"})j");
  ASSERT_OK(r);
  EXPECT_EQ(r->code, "print(1)");
  EXPECT_EQ(r->language, Language::kPython);
  EXPECT_EQ(r->stdin_data, "");
  EXPECT_EQ(r->timeout_seconds, 10);
  EXPECT_EQ(r->memory_bytes, 256LL << 20);
  EXPECT_EQ(r->output_cap, 1LL << 20);
  EXPECT_TRUE(r->files.empty());
  EXPECT_EQ(r->image, "");
  EXPECT_FALSE(r->fresh_interpreter);
}

TEST(CallRequest, EveryField) {
  auto r = parse(R"({"code": "cat a/b.txt", "language": "bash", "stdin_b64": "AP8=", "timeout": 2.5,
                     "memory": "64M", "files": {"a/b.txt": "aGk=", "c": ""}, "image": "debian:12+python:3.11",
                     "output_cap": 4096, "fresh_interpreter": true})");
  ASSERT_OK(r);
  EXPECT_EQ(r->language, Language::kBash);
  EXPECT_EQ(r->stdin_data, std::string("\x00\xff", 2));
  EXPECT_EQ(r->timeout_seconds, 2.5);
  EXPECT_EQ(r->memory_bytes, 64LL << 20);
  ASSERT_EQ(r->files.size(), 2u);
  EXPECT_EQ(r->files.at("a/b.txt"), "hi");
  EXPECT_EQ(r->files.at("c"), "");
  EXPECT_EQ(r->image, "debian:12+python:3.11");
  EXPECT_EQ(r->output_cap, 4096);
  EXPECT_TRUE(r->fresh_interpreter);
}

TEST(CallRequest, TextStdinAndZeroOutputCapMeansMaximum) {
  auto r = parse(R"({"code": "x", "stdin": "hello", "output_cap": 0, "memory": 40000000})");
  ASSERT_OK(r);
  EXPECT_EQ(r->stdin_data, "hello");
  EXPECT_EQ(r->output_cap, kMaxCallOutputCap);
  EXPECT_EQ(r->memory_bytes, 40000000);
}

TEST(CallRequest, RejectsBadFieldsNamingThem) {
  expectInvalid(R"({})", "'code': required");
  expectInvalid(R"({"code": ""})", "'code': empty");
  expectInvalid(R"({"code": 5})", "'code': expected a string");
  expectInvalid(R"({"code": "a\u0000b"})", "'code': contains a NUL");
  expectInvalid(R"({"code": "x", "cmd": "ls"})", "unknown field 'cmd'");
  expectInvalid(R"({"code": "x", "fresh_interpreter": "yes"})", "'fresh_interpreter': expected true or false");
  expectInvalid(R"({"code": "x", "language": "ruby"})", "'language': expected \"python\" or \"bash\"");
  expectInvalid(R"({"code": "x", "language": 1})", "'language'");
  expectInvalid(R"({"code": "x", "stdin": "a", "stdin_b64": "YQ=="})", "exclusive");
  expectInvalid(R"({"code": "x", "stdin_b64": "!!"})", "'stdin_b64'");
  expectInvalid(R"({"code": "x", "timeout": 0})", "'timeout': must be > 0");
  expectInvalid(R"({"code": "x", "timeout": -1})", "'timeout'");
  expectInvalid(R"({"code": "x", "timeout": 601})", "'timeout': at most 600");
  expectInvalid(R"({"code": "x", "timeout": "10"})", "'timeout': expected seconds");
  expectInvalid(R"({"code": "x", "memory": "16M"})", "'memory': must be at least 32M");
  expectInvalid(nlohmann::json{{"code", std::string((1u << 20) + 1, 'x')}}.dump(), "'code': longer than 1 MiB");
  expectInvalid(R"({"code": "x", "memory": "lots"})", "'memory'");
  expectInvalid(R"({"code": "x", "memory": "1T"})", "'memory': more than the node's memory");
  expectInvalid(R"({"code": "x", "output_cap": -1})", "'output_cap': must not be negative");
  expectInvalid(R"({"code": "x", "output_cap": 1.5})", "'output_cap': expected bytes");
  expectInvalid(R"({"code": "x", "output_cap": 99999999999})", "'output_cap': more than 16 MiB");
  expectInvalid(R"({"code": "x", "image": ""})", "'image'");
  expectInvalid(R"({"code": "x", "image": 3})", "'image'");
}

TEST(CallRequest, RejectsBadFiles) {
  expectInvalid(R"({"code": "x", "files": ["a"]})", "'files': expected an object");
  expectInvalid(R"({"code": "x", "files": {"/etc/passwd": ""}})", "not absolute");
  expectInvalid(R"({"code": "x", "files": {"../x": ""}})", "'..'");
  expectInvalid(R"({"code": "x", "files": {"a/../../x": ""}})", "'..'");
  expectInvalid(R"({"code": "x", "files": {"./x": ""}})", "'.'");
  expectInvalid(R"({"code": "x", "files": {"a//b": ""}})", "empty path component");
  expectInvalid(R"({"code": "x", "files": {"a/": ""}})", "empty path component");
  expectInvalid(R"({"code": "x", "files": {"": ""}})", "empty path");
  expectInvalid(R"({"code": "x", "files": {"a\u0000": ""}})", "NUL");
  expectInvalid(R"({"code": "x", "files": {"a": 1}})", "files[\"a\"]': expected a string");
  expectInvalid(R"({"code": "x", "files": {"a": "!!"}})", "not base64");
  expectInvalid(R"({"code": "x", "files": {"a": "", "a/b": ""}})", "is also a directory");
  std::string long_path(kMaxCallPathBytes + 1, 'p');
  expectInvalid(R"({"code": "x", "files": {")" + long_path + R"(": ""}})", "longer than");
  std::string many = R"({"code": "x", "files": {)";
  for (size_t i = 0; i <= kMaxCallFiles; ++i)
    many += (i ? "," : "") + std::string("\"f") + std::to_string(i) + "\": \"\"";
  expectInvalid(many + "}}", "more than 1000 files");
}

TEST(CallRequest, FilePathRules) {
  EXPECT_OK(validateCallFilePath("a"));
  EXPECT_OK(validateCallFilePath("dir/sub/file.py"));
  EXPECT_OK(validateCallFilePath("..hidden/x..y"));  // only whole '..' components are refused
  EXPECT_FALSE(validateCallFilePath("/a").ok());
  EXPECT_FALSE(validateCallFilePath("a/..").ok());
  EXPECT_FALSE(validateCallFilePath("a/.").ok());
}

}  // namespace
}  // namespace dsec::launcher
