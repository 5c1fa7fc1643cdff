#include <gtest/gtest.h>

#include "dsec/fs3/LayerRef.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::fs3 {
namespace {

TEST(LayerRefTest, ParsesGoodRefs) {
  auto r = parseLayerRef("debian:12");
  ASSERT_OK(r);
  EXPECT_EQ(r->name, "debian");
  EXPECT_EQ(r->version, "12");
  EXPECT_EQ(r->toString(), "debian:12");
  for (const char* good : {"python:3.11", "ws-demo:1", "a:B", "x.y_z-0:v1.2.3-rc_1", "0:0"}) {
    EXPECT_OK(parseLayerRef(good));
  }
  std::string longest = std::string(64, 'a') + ":" + std::string(64, 'V');
  EXPECT_OK(parseLayerRef(longest));
}

TEST(LayerRefTest, RejectsBadRefsNamingThem) {
  struct Case {
    const char* text;
    const char* expect_in_message;
  };
  for (const Case& c : std::vector<Case>{
           {"debian", "'debian' must be NAME:VERSION"},
           {"", "must be NAME:VERSION"},
           {":12", "empty layer name"},
           {"debian:", "empty layer version"},
           {"Debian:12", "invalid layer name 'Debian'"},
           {"-x:1", "invalid layer name '-x'"},
           {".hidden:1", "invalid layer name '.hidden'"},
           {"a/b:1", "invalid layer name 'a/b'"},
           {"a:..", "invalid layer version '..'"},
           {"a:.1", "invalid layer version '.1'"},
           {"a:1/2", "invalid layer version '1/2'"},
           {"a:1:2", "more than one ':'"},
           {"a b:1", "invalid layer name 'a b'"},
           {"a:1 ", "invalid layer version '1 '"},
       }) {
    auto r = parseLayerRef(c.text);
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_EQ(r.error().code(), ErrorCode::kInvalidArgument) << c.text;
    EXPECT_NE(r.error().message().find(c.expect_in_message), std::string::npos)
        << c.text << " -> " << r.error().message();
  }
  auto too_long = parseLayerRef(std::string(65, 'a') + ":1");
  ASSERT_ERROR(too_long, ErrorCode::kInvalidArgument);
  EXPECT_NE(too_long.error().message().find("longer than 64"), std::string::npos);
  ASSERT_ERROR(parseLayerRef("a:" + std::string(65, '1')), ErrorCode::kInvalidArgument);
}

TEST(LayerRefTest, ValidatesHandBuiltRefs) {
  EXPECT_OK(validateLayerRef({"debian", "12"}));
  ASSERT_ERROR(validateLayerRef({"..", "12"}), ErrorCode::kInvalidArgument);
  ASSERT_ERROR(validateLayerRef({"debian", "../../etc"}), ErrorCode::kInvalidArgument);
  ASSERT_ERROR(validateLayerRef({"debian", ""}), ErrorCode::kInvalidArgument);
}

TEST(LayerRefTest, ParsesImagesBottomFirst) {
  auto img = parseImageRef("debian:12+python:3.11+ws-demo:1");
  ASSERT_OK(img);
  ASSERT_EQ(img->size(), 3u);
  EXPECT_EQ((*img)[0], (LayerRef{"debian", "12"}));
  EXPECT_EQ((*img)[1], (LayerRef{"python", "3.11"}));
  EXPECT_EQ((*img)[2], (LayerRef{"ws-demo", "1"}));
  EXPECT_EQ(imageToString(*img), "debian:12+python:3.11+ws-demo:1");
  auto one = parseImageRef("debian:12");
  ASSERT_OK(one);
  EXPECT_EQ(one->size(), 1u);
}

TEST(LayerRefTest, RejectsBadImagesNamingThem) {
  struct Case {
    const char* text;
    const char* expect_in_message;
  };
  for (const Case& c : std::vector<Case>{
           {"", "empty image"},
           {"+debian:12", "empty layer at position 1"},
           {"debian:12+", "empty layer at position 2"},
           {"debian:12++py:3", "empty layer at position 2"},
           {"debian:12+debian:12", "lists layer 'debian' more than once"},
           {"debian:12+py:3+debian:13", "lists layer 'debian' more than once"},
           {"debian:12+Py:3", "invalid layer name 'Py'"},
           {"debian:12+py", "'py' must be NAME:VERSION"},
       }) {
    auto r = parseImageRef(c.text);
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_EQ(r.error().code(), ErrorCode::kInvalidArgument) << c.text;
    EXPECT_NE(r.error().message().find(c.expect_in_message), std::string::npos)
        << c.text << " -> " << r.error().message();
    if (*c.text != '\0') {
      EXPECT_NE(r.error().message().find(c.text), std::string::npos) << "message should name the image";
    }
  }
  std::string many;
  for (size_t i = 0; i <= kMaxImageLayers; ++i) many += (i ? "+l" : "l") + std::to_string(i) + ":1";
  ASSERT_ERROR(parseImageRef(many), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace dsec::fs3
