// Attack: learn the interpreter's hash seed in one call and use it in a later one (to craft keys that all
// collide in the later call's dicts and sets, e.g. a grader's, or to predict its set iteration order).
// CPython caches each str's hash in the object and every dict stores the hashes of its keys, so a fork of
// one interpreter cannot take a new seed: every call a zygote forks shares the zygote's seed. What holds:
// each worker's interpreter draws its own seed at start, nothing a call does changes the seed of any later
// call, and a call that asks for `fresh_interpreter` runs in an interpreter started for it with a seed of
// its own, which no earlier call can have learned. Default (forked) calls on one worker share its seed: a
// documented gap (docs/fncall.md, "The hash seed", has what a fresh interpreter per call costs).
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

// The grader's defence: a call with fresh_interpreter gets a seed that no earlier call on the worker saw,
// forked or fresh.
TEST_F(FncallNodeAttack, FreshInterpreterCallHasASeedNoEarlierCallCouldLearn) {
  start();
  if (IsSkipped() || HasFatalFailure()) return;
  auto forked = probe(call({{"code", kProbe}}));
  auto first = probe(call({{"code", kProbe}, {"fresh_interpreter", true}}));
  auto second = probe(call({{"code", kProbe}, {"fresh_interpreter", true}}));
  ASSERT_EQ(first[0], forked[0]) << "all calls on the same worker";
  ASSERT_EQ(second[0], forked[0]) << "all calls on the same worker";
  EXPECT_EQ(first[4], "1") << "hash randomization must be on";
  EXPECT_NE(first[1], forked[1]) << "a fresh interpreter call shares the worker's seed";
  EXPECT_NE(second[1], first[1]) << "two fresh interpreter calls share a seed";
  EXPECT_NE(second[2], first[2]) << "two fresh interpreter calls share a seed";
  // A call cannot pin the seed of the fresh interpreter a later call gets, through the environment or files.
  call({{"code", "import os\nos.environ['PYTHONHASHSEED'] = '0'\nopen('/tmp/seed', 'w').write('0')\n"}});
  auto later = probe(call({{"code", kProbe}, {"fresh_interpreter", true}}));
  // hash('x') under seed 0, computed by an interpreter the test starts with that seed.
  json pinned = call({{"code", "PYTHONHASHSEED=0 python3 -c \"print(hash('x'))\""}, {"language", "bash"}});
  ASSERT_EQ(pinned["exit_code"], 0) << pinned.dump();
  EXPECT_NE(later[1] + "\n", pinned["stdout"].get<std::string>())
      << "an earlier call fixed the seed of a later fresh interpreter";
  EXPECT_NE(later[1], first[1]);
}

}  // namespace
}  // namespace dsec::testing
