// Init's status lines are read by the chunk: lines that arrive together are read apart, a line that arrives in
// pieces is read whole, and nothing past a line is lost (it is the start of the next one).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <thread>

#include "InitPool.h"
#include "dsec/common/Strings.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::testing {
namespace {

class ContainerInitStatus : public ::testing::Test {
 protected:
  void SetUp() override {
    int fds[2];
    ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0);
    read_.reset(fds[0]);
    write_.reset(fds[1]);
  }
  void send(const std::string& text) {
    ASSERT_EQ(::write(write_.get(), text.data(), text.size()), static_cast<ssize_t>(text.size()));
  }
  Result<std::string> line() { return backends::readStatusLine(read_.get(), monotonicSeconds() + 5, buffered_); }

  UniqueFd read_, write_;
  std::string buffered_;
};

TEST_F(ContainerInitStatus, LinesThatArriveTogetherAreReadApartAndTheRestIsKept) {
  send("userns\ninit 4242\nok\n");
  auto first = line();
  ASSERT_OK(first);
  EXPECT_EQ(*first, "userns");
  auto second = line();
  ASSERT_OK(second);
  EXPECT_EQ(*second, "init 4242");
  EXPECT_EQ(buffered_, "ok\n") << "the ready line that came with the pid line was lost";
  auto third = line();
  ASSERT_OK(third);
  EXPECT_EQ(*third, "ok");
  EXPECT_TRUE(buffered_.empty());
}

TEST_F(ContainerInitStatus, ALineInPiecesIsReadWhole) {
  send("ini");
  std::thread rest([&] {
    ::usleep(50000);
    send("t 7\ner");
  });
  auto got = line();
  rest.join();
  ASSERT_OK(got);
  EXPECT_EQ(*got, "init 7");
  EXPECT_EQ(buffered_, "er");
}

TEST_F(ContainerInitStatus, ErrorLinesAndAnEarlyExitAreErrors) {
  send("err clone_init 12 clone PID 1\nlater");
  auto failed = line();
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.error().sysErrno(), 12);
  EXPECT_NE(failed.error().message().find("step clone_init: clone PID 1"), std::string::npos)
      << failed.error().message();
  write_.reset();  // init is gone before finishing its line
  auto gone = line();
  ASSERT_FALSE(gone.ok());
  EXPECT_NE(gone.error().message().find("exited while starting: later"), std::string::npos) << gone.error().message();
}

}  // namespace
}  // namespace dsec::testing
