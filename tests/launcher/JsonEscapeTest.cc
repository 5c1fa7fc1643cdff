// The streaming JSON string escaper against nlohmann::json's own dump (replace mode), on crafted and random
// bytes, cut into pieces at every place a UTF-8 sequence can be split.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "dsec/launcher/api/JsonEscape.h"

namespace dsec::launcher {
namespace {

using nlohmann::json;

// What nlohmann writes between the quotes of the string.
std::string reference(const std::string& raw) {
  std::string dumped = json(raw).dump(-1, ' ', false, json::error_handler_t::replace);
  return dumped.substr(1, dumped.size() - 2);
}

std::string escapeInPieces(const std::string& raw, const std::vector<size_t>& cuts) {
  JsonStringEscaper e;
  std::string out;
  size_t from = 0;
  for (size_t cut : cuts) {
    e.append(std::string_view(raw).substr(from, cut - from), &out);
    from = cut;
  }
  e.append(std::string_view(raw).substr(from), &out);
  e.finish(&out);
  return out;
}

void expectSameAsReference(const std::string& raw) {
  const std::string want = reference(raw);
  EXPECT_EQ(escapeInPieces(raw, {}), want);
  EXPECT_EQ(JsonStringEscaper::escapedSize(raw), want.size());
  for (size_t cut = 1; cut < raw.size(); ++cut) {
    ASSERT_EQ(escapeInPieces(raw, {cut}), want) << "cut at " << cut;
  }
}

TEST(JsonEscapeTest, PlainAndEscapedAscii) {
  expectSameAsReference("hello, world");
  expectSameAsReference("quote \" backslash \\ slash /");
  expectSameAsReference("\b\f\n\r\t");
  expectSameAsReference(std::string("\0\x01\x1f\x7f", 4));
  EXPECT_EQ(escapeInPieces(std::string(3, '\0'), {}), "\\u0000\\u0000\\u0000");
}

TEST(JsonEscapeTest, ValidUtf8PassesThrough) {
  expectSameAsReference("h\xC3\xA9llo");                       // é
  expectSameAsReference("\xE2\x82\xAC and \xF0\x9F\x98\x80");  // € and an emoji
  expectSameAsReference("\xEF\xBF\xBD");                       // U+FFFD itself
  expectSameAsReference("\xF4\x8F\xBF\xBF");                   // U+10FFFF
}

TEST(JsonEscapeTest, InvalidUtf8IsReplacedLikeNlohmann) {
  for (const std::string& raw : {
           std::string("\xFF"), std::string("\x80 stray continuation"),
           std::string("\xC0\xAF"),          // overlong
           std::string("\xE0\x80\x80"),      // overlong 3-byte
           std::string("\xED\xA0\x80"),      // surrogate
           std::string("\xF4\x90\x80\x80"),  // above U+10FFFF
           std::string("\xF5\x80"),
           std::string("\xE2\x82"),      // cut short at the end
           std::string("\xE2\x82x"),     // cut short by ASCII
           std::string("\xF0\x9F\x98"),  // cut short 4-byte
           std::string("\xC3\xC3\xA9"),  // a lead after a lead
       }) {
    expectSameAsReference(raw);
  }
}

TEST(JsonEscapeTest, RandomBytesInRandomPieces) {
  std::mt19937 rng(12345);
  for (int round = 0; round < 300; ++round) {
    std::string raw(1 + rng() % 200, '\0');
    for (char& c : raw) {
      // Biased towards the interesting bytes: controls, continuation bytes and leads.
      uint32_t pick = rng() % 4;
      c = static_cast<char>(pick == 0 ? rng() % 0x20 : pick == 1 ? 0x80 + rng() % 0x40 : rng() % 256);
    }
    std::vector<size_t> cuts;
    for (size_t i = 1; i < raw.size(); ++i) {
      if (rng() % 5 == 0) cuts.push_back(i);
    }
    const std::string want = reference(raw);
    ASSERT_EQ(escapeInPieces(raw, cuts), want) << "round " << round;
    ASSERT_EQ(JsonStringEscaper::escapedSize(raw), want.size());
  }
}

TEST(JsonEscapeTest, CountMatchesAppendAcrossPieces) {
  std::string raw = std::string(1000, '\0') + "\xE2\x82\xAC" + std::string(10, '"');
  JsonStringEscaper counter, writer;
  uint64_t counted = 0;
  std::string written;
  for (size_t off = 0; off < raw.size(); off += 7) {
    auto piece = std::string_view(raw).substr(off, 7);
    counter.count(piece, &counted);
    writer.append(piece, &written);
  }
  counter.finishCount(&counted);
  writer.finish(&written);
  EXPECT_EQ(counted, written.size());
  EXPECT_EQ(written, reference(raw));
}

}  // namespace
}  // namespace dsec::launcher
