// Attack: learn the interpreter's hash seed in one call and use it in a later one (to craft keys that all
// collide in the later call's dicts and sets, e.g. a grader's, or to predict its set iteration order).
// CPython caches each str's hash in the object and every dict stores the hashes of its keys, so a fork of
// one interpreter cannot take a new seed: every call a zygote forks shares the zygote's seed. What holds
// today: each worker's interpreter draws its own seed at start, and nothing a call does changes the seed of
// any later call. What does not (a known gap, docs/fncall.md): calls on the same worker share its seed;
// the test that checks it is disabled until the design changes (docs/fncall.md has the measured cost of a
// fresh interpreter per call).
#include <gtest/gtest.h>

#include "FncallNodeFixture.h"

namespace dsec::testing {
namespace {

using nlohmann::json;

constexpr const char* kProbe =
    "import os, socket, sys\n"
    "print(socket.gethostname(), hash('x'), hash(b'x'), sys.hash_info.algorithm, sys.flags.hash_randomization)\n";

// {worker, hash('x'), hash(b'x'), algorithm, randomization}
std::vector<std::string> probe(json r) {
  EXPECT_EQ(r["exit_code"], 0) << r.dump();
  std::string line = r["stdout"].get<std::string>();
  std::vector<std::string> fields;
  size_t start = 0;
  for (size_t i = 0; i <= line.size(); ++i) {
    if (i == line.size() || line[i] == ' ' || line[i] == '\n') {
      if (i > start) fields.push_back(line.substr(start, i - start));
      start = i + 1;
    }
  }
  EXPECT_EQ(fields.size(), 5u) << line;
  fields.resize(5);
  return fields;
}

TEST_F(FncallNodeAttack, HashSeedIsRandomPerWorkerAndNoCallCanFixIt) {
  start();
  if (IsSkipped() || HasFatalFailure()) return;
  auto first = probe(call({{"code", kProbe}}));
  EXPECT_EQ(first[4], "1") << "hash randomization must be on";
  // A call that tries to pin the seed for the calls after it.
  call({{"code", "import os\nos.environ['PYTHONHASHSEED'] = '0'\nos.putenv('PYTHONHASHSEED', '0')\n"}});
  auto later = probe(call({{"code", kProbe}}));
  EXPECT_EQ(later[0], first[0]) << "the same worker";
  EXPECT_EQ(later[1], first[1]) << "a call changed the seed later calls see";
  // A new worker (the node restarted) draws a new seed: knowing one worker's seed says nothing of another's.
  client_.reset();
  node_->stop(true);
  node_.reset();
  start();
  if (IsSkipped() || HasFatalFailure()) return;
  auto fresh = probe(call({{"code", kProbe}}));
  EXPECT_NE(fresh[0], first[0]) << "a new worker";
  EXPECT_NE(fresh[1], first[1]) << "two workers drew the same hash seed";
  EXPECT_NE(fresh[2], first[2]) << "two workers drew the same hash seed";
  std::printf("hash('x'): worker %s: %s, %s; worker %s: %s\n", first[0].c_str(), first[1].c_str(), later[1].c_str(),
              fresh[0].c_str(), fresh[1].c_str());
}

// Known gap: fails on this design (calls on one worker share its seed). Enable it when each call gets a seed
// of its own.
TEST_F(FncallNodeAttack, DISABLED_LaterCallOnTheSameWorkerCannotLearnTheSeedOfAnEarlierOne) {
  start();
  if (IsSkipped() || HasFatalFailure()) return;
  auto first = probe(call({{"code", kProbe}}));
  auto second = probe(call({{"code", kProbe}}));
  ASSERT_EQ(second[0], first[0]) << "both calls on the same worker";
  EXPECT_NE(second[1], first[1]) << "two calls on one worker share the hash seed";
}

}  // namespace
}  // namespace dsec::testing
