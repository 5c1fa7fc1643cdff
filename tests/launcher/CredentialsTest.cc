// Token and fleet file: created once with mode 0600, reused, and the fleet file removed only by its owner.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "dsec/common/Strings.h"
#include "dsec/launcher/api/Credentials.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::launcher {
namespace {

int fileMode(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? static_cast<int>(st.st_mode & 07777) : -1;
}

TEST(Token, CreatedOnceWithMode0600AndReused) {
  dsec::testing::TempDir dir;
  auto first = loadOrCreateToken(dir.path());
  ASSERT_OK(first);
  EXPECT_EQ(first->size(), 64u);
  EXPECT_EQ(fileMode(dir.path() + "/token"), 0600);
  auto second = loadOrCreateToken(dir.path());
  ASSERT_OK(second);
  EXPECT_EQ(*first, *second);
}

TEST(Token, ReplacesGarbage) {
  dsec::testing::TempDir dir;
  ASSERT_OK(writeFile(dir.path() + "/token", "not a token!"));
  auto token = loadOrCreateToken(dir.path());
  ASSERT_OK(token);
  EXPECT_EQ(token->size(), 64u);
}

TEST(FleetFile, WrittenPrivateAndRemovedOnlyByOwner) {
  dsec::testing::TempDir home;
  const char* old_home = std::getenv("HOME");
  std::string saved = old_home ? old_home : "";
  ::setenv("HOME", home.path().c_str(), 1);
  ASSERT_OK(writeFleetFile("t1", {"http://127.0.0.1:1234", "http://127.0.0.2:1234"}, "abcd", "n0", "/r"));
  std::string path = home.path() + "/.dsec/fleets/t1.json";
  EXPECT_EQ(path, fleetFilePath("t1"));
  EXPECT_EQ(fileMode(path), 0600);
  EXPECT_EQ(fileMode(home.path() + "/.dsec/fleets"), 0700);
  auto j = nlohmann::json::parse(*readFile(path));
  EXPECT_EQ(j["endpoint"], "http://127.0.0.1:1234");
  EXPECT_EQ(j["endpoints"], nlohmann::json::array({"http://127.0.0.1:1234", "http://127.0.0.2:1234"}));
  EXPECT_EQ(j["token"], "abcd");
  EXPECT_EQ(j["fleet"], "t1");
  removeFleetFileIfOurs("t1", "http://127.0.0.1:9999");  // someone else's endpoint: kept
  EXPECT_EQ(fileMode(path), 0600);
  removeFleetFileIfOurs("t1", "http://127.0.0.1:1234");
  EXPECT_EQ(fileMode(path), -1);
  ASSERT_ERROR(writeFleetFile("../evil", {"e"}, "t", "n", "r"), ErrorCode::kInvalidArgument);
  ASSERT_ERROR(writeFleetFile("t2", {}, "t", "n", "r"), ErrorCode::kInvalidArgument);
  if (old_home) ::setenv("HOME", saved.c_str(), 1);
}

}  // namespace
}  // namespace dsec::launcher
