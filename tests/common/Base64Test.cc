// The one base64 codec (common/Base64.h): RFC 4648 vectors both ways, every byte value and length through a
// round trip, the URL-safe alphabet, wrapped text, unpadded text, and clear errors for what is not base64.
#include <gtest/gtest.h>

#include "dsec/common/Base64.h"
#include "dsec/testing/TestSupport.h"

namespace dsec {
namespace {

TEST(Base64, Rfc4648Vectors) {
  const std::pair<const char*, const char*> vectors[] = {{"", ""},
                                                         {"f", "Zg=="},
                                                         {"fo", "Zm8="},
                                                         {"foo", "Zm9v"},
                                                         {"foob", "Zm9vYg=="},
                                                         {"fooba", "Zm9vYmE="},
                                                         {"foobar", "Zm9vYmFy"}};
  for (const auto& [plain, encoded] : vectors) {
    EXPECT_EQ(base64Encode(plain), encoded);
    auto back = base64Decode(encoded);
    ASSERT_OK(back);
    EXPECT_EQ(*back, plain);
  }
}

TEST(Base64, EveryByteAndLengthRoundTrips) {
  std::string bytes;
  for (int i = 0; i < 3 * 256 + 2; ++i) {
    bytes.push_back(static_cast<char>(i * 37 + 11));
    auto back = base64Decode(base64Encode(bytes));
    ASSERT_OK(back);
    ASSERT_EQ(*back, bytes) << "length " << bytes.size();
  }
}

TEST(Base64, LenientWhereClientsDiffer) {
  EXPECT_EQ(*base64Decode("AAEC/w=="), std::string("\x00\x01\x02\xff", 4));
  EXPECT_EQ(*base64Decode("AAEC_w=="), std::string("\x00\x01\x02\xff", 4)) << "URL-safe alphabet";
  EXPECT_EQ(*base64Decode("+-/_"), *base64Decode("++//"));
  EXPECT_EQ(*base64Decode("Zm9v\r\nYmFy\n"), "foobar") << "wrapped text";
  EXPECT_EQ(*base64Decode("Zg"), "f") << "no padding";
  EXPECT_EQ(*base64Decode("Zm8"), "fo") << "no padding";
}

TEST(Base64, RejectsWhatIsNotBase64) {
  ASSERT_ERROR(base64Decode("Z"), ErrorCode::kInvalidArgument);
  ASSERT_ERROR(base64Decode("Zm9vY"), ErrorCode::kInvalidArgument);
  ASSERT_ERROR(base64Decode("YQ==YQ"), ErrorCode::kInvalidArgument);
  ASSERT_ERROR(base64Decode("Zm9v="), ErrorCode::kInvalidArgument);
  ASSERT_ERROR(base64Decode("Zg==="), ErrorCode::kInvalidArgument);
  ASSERT_ERROR(base64Decode("Zg="), ErrorCode::kInvalidArgument);
  ASSERT_ERROR(base64Decode("Zm 9v"), ErrorCode::kInvalidArgument);
  ASSERT_ERROR(base64Decode("Zm9v!"), ErrorCode::kInvalidArgument);
  auto e = base64Decode("ab$d");
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().message().find("invalid base64 character"), std::string::npos);
}

}  // namespace
}  // namespace dsec
