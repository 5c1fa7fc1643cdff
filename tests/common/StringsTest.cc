#include <gtest/gtest.h>
#include <sys/stat.h>

#include "dsec/common/Strings.h"
#include "dsec/testing/TestSupport.h"

namespace dsec {
namespace {

TEST(ParseByteSize, AcceptsPlainAndSuffixedSizes) {
  EXPECT_EQ(*parseByteSize("1048576"), 1048576);
  EXPECT_EQ(*parseByteSize("64k"), 64 * 1024);
  EXPECT_EQ(*parseByteSize("512M"), 512LL << 20);
  EXPECT_EQ(*parseByteSize("1G"), 1LL << 30);
  EXPECT_EQ(*parseByteSize("1.5GiB"), 3LL << 29);
  EXPECT_EQ(*parseByteSize(" 2 "), 2);
}

TEST(ParseByteSize, RejectsGarbageWithTheInputInTheMessage) {
  ASSERT_ERROR(parseByteSize(""), ErrorCode::kInvalidArgument);
  ASSERT_ERROR(parseByteSize("-1M"), ErrorCode::kInvalidArgument);
  ASSERT_ERROR(parseByteSize("12X"), ErrorCode::kInvalidArgument);
  ASSERT_ERROR(parseByteSize("M"), ErrorCode::kInvalidArgument);
  ASSERT_ERROR(parseByteSize("99999999999T"), ErrorCode::kInvalidArgument);
  auto r = parseByteSize("12X");
  EXPECT_NE(r.error().message().find("12X"), std::string::npos);
}

TEST(Strings, SplitTrimRandom) {
  EXPECT_EQ(split("a+b+c", '+'), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(split("", '+'), (std::vector<std::string>{""}));
  EXPECT_EQ(trim("  x y \n"), "x y");
  auto a = randomHex(16);
  auto b = randomHex(16);
  EXPECT_EQ(a.size(), 16u);
  EXPECT_NE(a, b);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos);
}

TEST(Files, AtomicWriteReadAndRemoveTree) {
  testing::TempDir dir;
  std::string nested = dir.path() + "/a/b/c";
  ASSERT_OK(makeDirs(nested));
  ASSERT_OK(writeFileAtomic(nested + "/f", "hello", 0600));
  auto content = readFile(nested + "/f");
  ASSERT_OK(content);
  EXPECT_EQ(*content, "hello");
  struct stat st {};
  ASSERT_EQ(::stat((nested + "/f").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_OK(removeTree(dir.path() + "/a"));
  EXPECT_NE(::access((dir.path() + "/a").c_str(), F_OK), 0);
  EXPECT_OK(removeTree(dir.path() + "/missing"));
  ASSERT_ERROR(readFile(dir.path() + "/missing"), ErrorCode::kNotFound);
}

TEST(Files, MakeDirsRefusesAFile) {
  testing::TempDir dir;
  ASSERT_OK(writeFile(dir.path() + "/file", "x"));
  ASSERT_ERROR(makeDirs(dir.path() + "/file"), ErrorCode::kInvalidArgument);
}

TEST(Strings, HexPercentAndTimeEncodings) {
  EXPECT_EQ(hexEncode(std::string("\x00\x7f\xff", 3)), "007fff");
  EXPECT_EQ(hexEncode(""), "");
  EXPECT_EQ(percentEncode("a b/c%d=e&f~g.h_i-j"), "a%20b%2Fc%25d%3De%26f~g.h_i-j");
  EXPECT_EQ(percentEncode("/tmp/a b", true), "/tmp/a%20b");
  EXPECT_EQ(percentEncode("\xc3\xa9"), "%C3%A9");
  EXPECT_EQ(rfc3339(0), "1970-01-01T00:00:00Z");
  EXPECT_EQ(rfc3339(1796641620.9), "2026-12-07T11:07:00Z");
}

}  // namespace
}  // namespace dsec
