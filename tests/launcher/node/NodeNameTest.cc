#include <gtest/gtest.h>

#include "dsec/launcher/node/NodeName.h"

namespace dsec::launcher {
namespace {

TEST(NodeName, TakesOnlyTheRule) {
  for (const char* good : {"a", "node-1", "0", "abcdefghijklmnopqrstuvwxyz012345"}) {
    EXPECT_TRUE(validateNodeName(good).ok()) << good;
  }
  for (const char* bad : {"", "-a", "Node", "a_b", "a.b", "a b", "abcdefghijklmnopqrstuvwxyz0123456", "a/b"}) {
    auto st = validateNodeName(bad);
    ASSERT_FALSE(st.ok()) << bad;
    EXPECT_NE(st.error().message().find("[a-z0-9-]"), std::string::npos) << st.error().message();
  }
}

TEST(NodeName, AnyTextBecomesAValidName) {
  EXPECT_EQ(nodeNameFrom("CPU-Node_07"), "cpu-node-07");
  EXPECT_EQ(nodeNameFrom("--x"), "x");
  EXPECT_EQ(nodeNameFrom(""), "node");
  EXPECT_EQ(nodeNameFrom("---"), "node");
  EXPECT_EQ(nodeNameFrom(std::string(40, 'a')), std::string(32, 'a'));
  for (const char* raw : {"Host.Example", "a b\tc", "\xff\x01z"})
    EXPECT_TRUE(validateNodeName(nodeNameFrom(raw)).ok()) << raw;
}

}  // namespace
}  // namespace dsec::launcher
