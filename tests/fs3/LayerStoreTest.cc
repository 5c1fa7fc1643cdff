#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/stat.h>

#include <cstdlib>
#include <ctime>
#include <nlohmann/json.hpp>
#include <regex>

#include "LayerTestUtil.h"
#include "dsec/common/Fault.h"
#include "dsec/common/Strings.h"
#include "dsec/fs3/LayerStore.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::fs3 {
namespace {

using ::dsec::testing::TempDir;
using namespace ::dsec::fs3::testing;

// Entries of dir that are not "." or "..".
std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (struct dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n != "." && n != "..") out.push_back(n);
    }
    ::closedir(d);
  }
  return out;
}

bool pathExists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

class LayerStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DSEC_SKIP_UNLESS_IMAGES();
    ASSERT_OK(store_.init());
    ASSERT_OK(makeSampleTree(src_));
  }
  void TearDown() override { armFault(""); }

  TempDir tmp_;
  std::string src_ = tmp_.path() + "/src";
  LayerStore store_{tmp_.path() + "/store"};
  LayerRef ref_{"sample", "1"};
};

TEST_F(LayerStoreTest, BuildsFromDirWithManifest) {
  time_t before = ::time(nullptr);
  auto m = store_.buildFromDir(ref_, src_, "debian:12", "");
  ASSERT_OK(m);
  EXPECT_EQ(m->ref, ref_);
  EXPECT_EQ(m->built_on, "debian:12");
  EXPECT_EQ(m->source, "dir:" + src_);
  std::string image = store_.imagePath(ref_);
  EXPECT_EQ(image, tmp_.path() + "/store/layers/sample/1/layer.erofs");
  struct stat st {};
  ASSERT_EQ(::stat(image.c_str(), &st), 0);
  EXPECT_EQ(m->size, st.st_size);
  EXPECT_GT(m->size, 0);
  EXPECT_EQ(st.st_mode & 0777, 0444u) << "images are read-only files";
  EXPECT_EQ(m->sha256, sha256sumOf(image));
  ASSERT_TRUE(std::regex_match(m->created, std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)"))) << m->created;
  struct tm tm {};
  ASSERT_NE(::strptime(m->created.c_str(), "%Y-%m-%dT%H:%M:%SZ", &tm), nullptr);
  time_t created = ::timegm(&tm);
  EXPECT_GE(created, before - 1);
  EXPECT_LE(created, ::time(nullptr) + 1);

  // manifest.json on disk holds the same, with the documented keys.
  auto text = readFile(store_.layerDir(ref_) + "/manifest.json");
  ASSERT_OK(text);
  auto j = nlohmann::json::parse(*text);
  EXPECT_EQ(j.at("name"), "sample");
  EXPECT_EQ(j.at("version"), "1");
  EXPECT_EQ(j.at("sha256"), m->sha256);
  EXPECT_EQ(j.at("size"), m->size);
  EXPECT_EQ(j.at("created"), m->created);
  EXPECT_EQ(j.at("built_on"), "debian:12");
  EXPECT_EQ(j.at("source"), "dir:" + src_);

  auto got = store_.get(ref_);
  ASSERT_OK(got);
  EXPECT_EQ(got->sha256, m->sha256);
  EXPECT_TRUE(store_.exists(ref_));
  auto all = store_.list();
  ASSERT_OK(all);
  ASSERT_EQ(all->size(), 1u);
  EXPECT_EQ((*all)[0].ref, ref_);
  // Only the layer is left: no staging dirs.
  EXPECT_EQ(entries(tmp_.path() + "/store/layers"), std::vector<std::string>{"sample"});
  EXPECT_EQ(entries(store_.layerDir(ref_)).size(), 2u);
}

TEST_F(LayerStoreTest, RefusesToRebuildAndKeepsTheFirst) {
  auto first = store_.buildFromDir(ref_, src_, "", "");
  ASSERT_OK(first);
  ASSERT_OK(writeSample(src_ + "/new.txt", "changed\n"));
  auto again = store_.buildFromDir(ref_, src_, "", "");
  ASSERT_ERROR(again, ErrorCode::kAlreadyExists);
  EXPECT_EQ(again.error().message(), "layer sample:1 already exists; layers are immutable - build a new version");
  auto got = store_.get(ref_);
  ASSERT_OK(got);
  EXPECT_EQ(got->sha256, first->sha256);
  EXPECT_EQ(got->created, first->created);
  EXPECT_EQ(sha256sumOf(store_.imagePath(ref_)), first->sha256);
  // A new version of the same layer is fine, and versions are independent.
  ASSERT_OK(store_.buildFromDir({"sample", "2"}, src_, "", ""));
  auto all = store_.list();
  ASSERT_OK(all);
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[1].ref, (LayerRef{"sample", "2"}));
  EXPECT_NE((*all)[1].sha256, first->sha256);
}

TEST_F(LayerStoreTest, FailedMkfsLeavesNothing) {
  // A mkfs.erofs that writes half an image and fails, found first on PATH.
  std::string bin = tmp_.path() + "/bin";
  ASSERT_OK(makeDirs(bin));
  ASSERT_OK(writeSample(bin + "/mkfs.erofs",
                        "#!/bin/sh\necho partial > \"$3\"\necho 'boom: no space left' >&2\nexit 3\n", 0755));
  std::string old_path = getenv("PATH");
  setenv("PATH", (bin + ":" + old_path).c_str(), 1);
  auto r = store_.buildFromDir(ref_, src_, "", "");
  setenv("PATH", old_path.c_str(), 1);
  ASSERT_ERROR(r, ErrorCode::kSystem);
  EXPECT_NE(r.error().message().find("boom: no space left"), std::string::npos) << r.error().message();
  EXPECT_NE(r.error().message().find("status 3"), std::string::npos) << r.error().message();
  EXPECT_NE(r.error().message().find("sample:1"), std::string::npos) << r.error().message();
  EXPECT_FALSE(store_.exists(ref_));
  EXPECT_TRUE(entries(tmp_.path() + "/store/layers").empty());
  // And the real one works afterwards.
  ASSERT_OK(store_.buildFromDir(ref_, src_, "", ""));
}

TEST_F(LayerStoreTest, FailureJustBeforePublishLeavesNothing) {
  armFault("fs3.before_publish");
  auto r = store_.buildFromDir(ref_, src_, "", "");
  ASSERT_FALSE(r.ok());
  EXPECT_FALSE(store_.exists(ref_));
  EXPECT_TRUE(entries(tmp_.path() + "/store/layers").empty());
}

TEST_F(LayerStoreTest, RejectsBadSources) {
  auto missing = store_.buildFromDir(ref_, tmp_.path() + "/nope", "", "");
  ASSERT_ERROR(missing, ErrorCode::kInvalidArgument);
  EXPECT_NE(missing.error().message().find(tmp_.path() + "/nope"), std::string::npos);
  auto file = store_.buildFromDir(ref_, src_ + "/hello.txt", "", "");
  ASSERT_ERROR(file, ErrorCode::kInvalidArgument);
  EXPECT_NE(file.error().message().find("not a directory"), std::string::npos);
  ASSERT_ERROR(store_.buildFromDir({"../evil", "1"}, src_, "", ""), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(entries(tmp_.path() + "/store/layers").empty());
  EXPECT_FALSE(pathExists(tmp_.path() + "/store/evil"));
}

TEST_F(LayerStoreTest, RemoveGetAndCheckImage) {
  ASSERT_OK(store_.buildFromDir(ref_, src_, "", ""));
  ASSERT_OK(store_.checkImage({ref_}));
  auto missing = store_.checkImage({ref_, {"tools", "7"}});
  ASSERT_ERROR(missing, ErrorCode::kNotFound);
  EXPECT_NE(missing.error().message().find("tools:7"), std::string::npos);
  ASSERT_ERROR(store_.get({"tools", "7"}), ErrorCode::kNotFound);

  ASSERT_OK(store_.remove(ref_));
  EXPECT_FALSE(store_.exists(ref_));
  ASSERT_ERROR(store_.get(ref_), ErrorCode::kNotFound);
  ASSERT_ERROR(store_.remove(ref_), ErrorCode::kNotFound);
  EXPECT_TRUE(entries(tmp_.path() + "/store/layers").empty()) << "NAME dir and staging dir are gone too";
  // Removed, the name is free again.
  ASSERT_OK(store_.buildFromDir(ref_, src_, "", ""));
}

TEST_F(LayerStoreTest, InitRemovesStaleStagingDirsButNotLiveOnes) {
  std::string layers = tmp_.path() + "/store/layers";
  ASSERT_OK(makeDirs(layers + "/.tmp-crashed/rootfs/etc"));
  ASSERT_OK(writeSample(layers + "/.tmp-crashed/layer.erofs", "half"));
  ASSERT_OK(makeDirs(layers + "/.tmp-running"));
  UniqueFd lock(::open((layers + "/.tmp-running").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  ASSERT_TRUE(lock.valid());
  ASSERT_EQ(::flock(lock.get(), LOCK_EX), 0);
  LayerStore again(tmp_.path() + "/store");
  ASSERT_OK(again.init());
  EXPECT_FALSE(pathExists(layers + "/.tmp-crashed"));
  EXPECT_TRUE(pathExists(layers + "/.tmp-running"));
  auto all = again.list();
  ASSERT_OK(all);
  EXPECT_TRUE(all->empty());
}

TEST(LayerStoreRootTest, InitCreatesRootAndRejectsFiles) {
  DSEC_SKIP_UNLESS_ROOT();
  TempDir tmp;
  LayerStore store(tmp.path() + "/a/b/store/");
  EXPECT_EQ(store.root(), tmp.path() + "/a/b/store");
  ASSERT_OK(store.init());
  struct stat st {};
  ASSERT_EQ(::stat((tmp.path() + "/a/b/store/layers").c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0755u);
  ASSERT_OK(writeFile(tmp.path() + "/file", "x"));
  LayerStore bad(tmp.path() + "/file");
  ASSERT_ERROR(bad.init(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace dsec::fs3
