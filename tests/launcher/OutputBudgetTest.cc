// The node-wide output budget's rules: room is taken and given back, the largest evictable share gives way
// when the budget is full, only answers being written are waited for, and one answer never exceeds the whole.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "dsec/launcher/api/OutputBudget.h"

namespace dsec::launcher {
namespace {

using Take = OutputBudget::Take;

struct FakeOutput : OutputBudget::Evictable {
  std::atomic<int> evictions{0};
  void evict() override { evictions++; }
};

TEST(OutputBudgetTest, TakesAndGivesBack) {
  OutputBudget budget(100, 1);
  FakeOutput out;
  {
    auto share = budget.open(&out);
    EXPECT_EQ(share->take(60), Take::kOk);
    EXPECT_EQ(share->take(40), Take::kOk);
    EXPECT_EQ(budget.stats().used, 100u);
    share->give(30);
    EXPECT_EQ(budget.stats().used, 70u);
    EXPECT_EQ(budget.stats().shares, 1u);
  }
  auto s = budget.stats();
  EXPECT_EQ(s.used, 0u);
  EXPECT_EQ(s.peak, 100u);
  EXPECT_EQ(s.shares, 0u);
  EXPECT_EQ(out.evictions.load(), 0);
}

TEST(OutputBudgetTest, MoreThanTheWholeBudgetIsTooLarge) {
  OutputBudget budget(100, 1);
  FakeOutput out;
  auto share = budget.open(&out);
  EXPECT_EQ(share->take(80), Take::kOk);
  EXPECT_EQ(share->take(30), Take::kTooLarge);
  EXPECT_FALSE(share->seal());  // finished: its owner drops the output
  share->releaseAll();
  EXPECT_EQ(budget.stats().used, 0u);
  EXPECT_EQ(budget.stats().too_large, 1u);
}

TEST(OutputBudgetTest, LargestCollectingShareIsEvictedForASmallerOne) {
  OutputBudget budget(100, 1);
  FakeOutput big_out, small_out;
  auto big = budget.open(&big_out);
  auto small = budget.open(&small_out);
  ASSERT_EQ(big->take(90), Take::kOk);
  ASSERT_EQ(small->take(5), Take::kOk);
  EXPECT_EQ(small->take(20), Take::kOk);  // the budget is full: the largest (big) gives way
  EXPECT_EQ(big_out.evictions.load(), 1);
  EXPECT_EQ(small_out.evictions.load(), 0);
  EXPECT_EQ(big->held(), 0u);
  EXPECT_EQ(big->take(1), Take::kBusy);
  EXPECT_FALSE(big->seal());
  EXPECT_TRUE(small->seal());
  auto s = budget.stats();
  EXPECT_EQ(s.used, 25u);
  EXPECT_EQ(s.evictions, 1u);
}

TEST(OutputBudgetTest, TheLargestAskingShareGivesWayItself) {
  OutputBudget budget(100, 1);
  FakeOutput a_out, b_out;
  auto a = budget.open(&a_out);
  auto b = budget.open(&b_out);
  ASSERT_EQ(a->take(30), Take::kOk);
  ASSERT_EQ(b->take(60), Take::kOk);
  EXPECT_EQ(b->take(20), Take::kBusy);  // b is the largest: it fails, a keeps its output
  EXPECT_EQ(a_out.evictions.load(), 0);
  EXPECT_FALSE(b->seal());
  b->releaseAll();
  EXPECT_EQ(budget.stats().used, 30u);
  EXPECT_EQ(a->take(20), Take::kOk);
}

TEST(OutputBudgetTest, SealedAnswersAreNeverEvicted) {
  OutputBudget budget(100, 0.05);
  FakeOutput sending_out, asking_out;
  auto sending = budget.open(&sending_out);
  ASSERT_EQ(sending->take(90), Take::kOk);
  ASSERT_TRUE(sending->seal());
  auto asking = budget.open(&asking_out);
  EXPECT_EQ(asking->take(20), Take::kBusy);  // waited its 50 ms for the answer being written, in vain
  EXPECT_EQ(sending_out.evictions.load(), 0);
  EXPECT_EQ(budget.stats().refusals, 1u);
}

TEST(OutputBudgetTest, AskWaitsForAnAnswerBeingWritten) {
  OutputBudget budget(100, 60);
  FakeOutput sending_out;
  auto sending = budget.open(&sending_out);
  ASSERT_EQ(sending->take(90), Take::kOk);
  ASSERT_TRUE(sending->seal());
  std::atomic<int> result{-1};
  std::thread asker([&] {
    auto call_result = budget.open(nullptr);  // a call's result: never evicted
    result = static_cast<int>(call_result->take(50));
  });
  sending->give(90);  // the client read the answer (before or after the ask: either way it fits then)
  asker.join();
  EXPECT_EQ(result.load(), static_cast<int>(Take::kOk));
}

TEST(OutputBudgetTest, ResultsThatAreWholeEvictCollectingOutput) {
  OutputBudget budget(100, 1);
  FakeOutput collecting_out;
  auto collecting = budget.open(&collecting_out);
  ASSERT_EQ(collecting->take(70), Take::kOk);
  auto result = budget.open(nullptr);
  EXPECT_EQ(result->take(50), Take::kOk);
  EXPECT_EQ(collecting_out.evictions.load(), 1);
}

TEST(OutputBudgetTest, DefaultIsASixteenthOfMemoryWithinBounds) {
  EXPECT_EQ(defaultOutputBudget(uint64_t{24} << 30), uint64_t{1} << 30);
  EXPECT_EQ(defaultOutputBudget(uint64_t{4} << 30), uint64_t{256} << 20);
  EXPECT_EQ(defaultOutputBudget(uint64_t{512} << 20), uint64_t{64} << 20);
}

}  // namespace
}  // namespace dsec::launcher
