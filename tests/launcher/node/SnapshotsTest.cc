// The snapshot store (launcher/node/Snapshots.h) on a temporary directory: names, staging and publishing, listing,
// a corrupt or foreign snapshot.json skipped, removal, and the store's own files private. No root needed.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <utime.h>

#include "dsec/common/Directory.h"
#include "dsec/common/Strings.h"
#include "dsec/fs3/LayerRef.h"
#include "dsec/launcher/node/Snapshots.h"

namespace dsec::launcher {
namespace {

class SnapshotsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/dsec-snapshots-test-XXXXXX";
    base_ = mkdtemp(tmpl);
    store_ = std::make_unique<SnapshotStore>(base_ + "/snapshots");
    ASSERT_TRUE(store_->init().ok());
  }
  void TearDown() override { (void)removeTree(base_); }

  SnapshotMeta meta(const std::string& image = "debian:12") {
    SnapshotMeta m;
    m.kind = backends::SnapshotKind::kFilesystem;
    m.image = image;
    m.source = "n0-0123456789abcdef";
    m.node = "n0";
    m.params.image = image;
    m.params.layers = *fs3::parseImageRef(image);
    m.params.memory_bytes = 64 << 20;
    m.params.labels = {{"run", "7"}};
    return m;
  }
  // Takes a snapshot named name holding one file of `bytes` bytes.
  Status take(const std::string& name, size_t bytes = 10, double created = 0) {
    auto staging = store_->begin(name);
    if (!staging.ok()) return staging.error();
    DSEC_TRY(writeFile(staging->path() + "/upper.erofs", std::string(bytes, 'x')));
    SnapshotMeta m = meta();
    m.layer = snapshotLayerName(name);
    m.created_unix = created;
    return staging->publish(m);
  }
  std::vector<std::string> entries() {
    std::vector<std::string> names;
    auto listed = listDirectory(store_->dir());
    if (!listed.ok()) return {"<" + listed.error().toString() + ">"};
    for (const auto& e : *listed) names.push_back(e.name);
    std::sort(names.begin(), names.end());
    return names;
  }

  std::string base_;
  std::unique_ptr<SnapshotStore> store_;
};

TEST(SnapshotNames, FollowTheRule) {
  for (const char* good : {"a", "0", "fork-1", "a.b_c-d", "snap-0123456789ab"}) {
    EXPECT_TRUE(validateSnapshotName(good).ok()) << good;
  }
  for (const char* bad : {"", "-a", ".a", "_a", "A", "a/b", "..", "a b", "é"}) {
    EXPECT_FALSE(validateSnapshotName(bad).ok()) << bad;
  }
  EXPECT_TRUE(validateSnapshotName(std::string(64, 'a')).ok());
  EXPECT_FALSE(validateSnapshotName(std::string(65, 'a')).ok());
  std::string generated = generateSnapshotName();
  EXPECT_TRUE(validateSnapshotName(generated).ok()) << generated;
  EXPECT_EQ(generated.rfind("snap-", 0), 0u);
  EXPECT_NE(generated, generateSnapshotName());
}

TEST(SnapshotNames, LayerNamesAreValidLayersEvenForLongNames) {
  EXPECT_EQ(snapshotLayerName("abc"), "snap-abc:1");
  std::string a(64, 'a'), b = std::string(63, 'a') + "b";
  for (const auto& name : {a, b}) {
    auto ref = fs3::parseLayerRef(snapshotLayerName(name));
    EXPECT_TRUE(ref.ok()) << snapshotLayerName(name) << ": " << ref.error().toString();
  }
  EXPECT_NE(snapshotLayerName(a), snapshotLayerName(b)) << "two long names share a layer";
}

TEST_F(SnapshotsTest, PublishedSnapshotIsListedWithItsMetadata) {
  ASSERT_TRUE(take("one", 1000).ok());
  auto got = store_->get("one");
  ASSERT_TRUE(got.ok()) << got.error().toString();
  EXPECT_EQ(got->name, "one");
  EXPECT_EQ(got->kind, backends::SnapshotKind::kFilesystem);
  EXPECT_EQ(got->image, "debian:12");
  EXPECT_EQ(got->layer, "snap-one:1");
  EXPECT_EQ(got->source, "n0-0123456789abcdef");
  EXPECT_EQ(got->params.memory_bytes, 64 << 20);
  EXPECT_EQ(got->params.labels.at("run"), "7");
  EXPECT_GE(got->bytes, 1000);
  EXPECT_GT(got->created_unix, 0);
  ASSERT_TRUE(take("two").ok());
  auto all = store_->list();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].name, "one");
  EXPECT_EQ(all[1].name, "two");
  // Private: the store and each snapshot are root's alone.
  struct stat st {};
  ASSERT_EQ(stat(store_->dir().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(stat(store_->pathOf("one").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  EXPECT_EQ(entries(), (std::vector<std::string>{"one", "two"})) << "a staging dir was left";
}

TEST_F(SnapshotsTest, TakenNameIsRefusedAndTheLoserLeavesNothing) {
  ASSERT_TRUE(take("same").ok());
  auto again = store_->begin("same");
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().code(), ErrorCode::kAlreadyExists);
  // Two writers of one name: the first rename wins, the second is refused and its staging dir removed.
  auto a = store_->begin("race");
  auto b = store_->begin("race");
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(writeFile(a->path() + "/f", "a").ok());
  ASSERT_TRUE(writeFile(b->path() + "/f", "b").ok());
  SnapshotMeta ma = meta(), mb = meta();
  ma.layer = mb.layer = snapshotLayerName("race");
  ASSERT_TRUE(a->publish(ma).ok());
  Status lost = b->publish(mb);
  ASSERT_FALSE(lost.ok());
  EXPECT_EQ(lost.error().code(), ErrorCode::kAlreadyExists);
  { auto drop = std::move(*b); }
  EXPECT_EQ(entries(), (std::vector<std::string>{"race", "same"}));
  EXPECT_EQ(*readFile(store_->pathOf("race") + "/f"), "a");
}

TEST_F(SnapshotsTest, UnpublishedStagingIsRemoved) {
  {
    auto staging = store_->begin("never");
    ASSERT_TRUE(staging.ok());
    ASSERT_TRUE(writeFile(staging->path() + "/upper.erofs", "partial").ok());
  }
  EXPECT_TRUE(entries().empty());
  EXPECT_EQ(store_->get("never").error().code(), ErrorCode::kNotFound);
}

TEST_F(SnapshotsTest, CorruptOrForeignSnapshotJsonIsSkippedNotFatal) {
  ASSERT_TRUE(take("good").ok());
  for (const char* name : {"garbage", "empty", "wrong-name", "bad-kind"}) {
    ASSERT_TRUE(makeDirs(store_->pathOf(name), 0700).ok());
  }
  ASSERT_TRUE(writeFile(store_->pathOf("garbage") + "/snapshot.json", "{not json").ok());
  ASSERT_TRUE(writeFile(store_->pathOf("empty") + "/snapshot.json", "").ok());
  std::string good = *readFile(store_->pathOf("good") + "/snapshot.json");
  auto j = nlohmann::json::parse(good);
  j["name"] = "good";
  ASSERT_TRUE(writeFile(store_->pathOf("wrong-name") + "/snapshot.json", j.dump()).ok());
  j["name"] = "bad-kind";
  j["kind"] = "quantum";
  ASSERT_TRUE(writeFile(store_->pathOf("bad-kind") + "/snapshot.json", j.dump()).ok());
  auto all = store_->list();
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].name, "good");
  for (const char* name : {"garbage", "empty", "wrong-name", "bad-kind"}) {
    EXPECT_EQ(store_->get(name).error().code(), ErrorCode::kNotFound) << name;
  }
  // A corrupt one can still be removed.
  EXPECT_TRUE(store_->remove("garbage").ok());
  EXPECT_EQ(store_->remove("garbage").error().code(), ErrorCode::kNotFound);
}

TEST_F(SnapshotsTest, RemoveIsAtOnceAndComplete) {
  ASSERT_TRUE(take("gone", 4096).ok());
  ASSERT_TRUE(store_->remove("gone").ok());
  EXPECT_EQ(store_->get("gone").error().code(), ErrorCode::kNotFound);
  EXPECT_TRUE(entries().empty());
  EXPECT_FALSE(store_->remove("../x").ok());
}

TEST_F(SnapshotsTest, CreationTimesAreKeptForRetention) {
  ASSERT_TRUE(take("old", 10, 1000).ok());
  ASSERT_TRUE(take("new").ok());
  auto all = store_->list();
  ASSERT_EQ(all.size(), 2u);
  auto old = store_->get("old");
  ASSERT_TRUE(old.ok());
  EXPECT_EQ(old->created_unix, 1000);
  EXPECT_GT(store_->get("new")->created_unix, 1e9);
}

TEST_F(SnapshotsTest, InitRemovesOnlyStaleStagingDirs) {
  std::string stale = store_->dir() + "/.tmp-stale", young = store_->dir() + "/.tmp-young";
  ASSERT_TRUE(makeDirs(stale, 0700).ok());
  ASSERT_TRUE(makeDirs(young, 0700).ok());
  struct utimbuf old_times = {1000, 1000};
  ASSERT_EQ(utime(stale.c_str(), &old_times), 0);
  ASSERT_TRUE(store_->init().ok());
  EXPECT_EQ(entries(), (std::vector<std::string>{".tmp-young"})) << "another node's staging is young";
}

}  // namespace
}  // namespace dsec::launcher
