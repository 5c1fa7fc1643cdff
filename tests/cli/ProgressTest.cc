// The progress display of long commands (cli/src/Progress.h): a log gets one line per step, a terminal a status
// line rewritten in place.
#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "Progress.h"

namespace dsec::cli {
namespace {

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(Progress, ALogGetsOneLinePerStepAndOneAtTheEnd) {
  std::ostringstream out;
  {
    Progress progress("layer build x:1", out, false);
    progress.step("debootstrap bookworm");
    progress.detail("Retrieving Packages");  // a terminal's news only
    progress.step("creates", 10);
    for (int i = 0; i < 10; ++i) progress.advance();
    progress.finish("10 created");
  }
  const std::string text = out.str();
  EXPECT_EQ(text.find('\r'), std::string::npos) << text;
  EXPECT_EQ(text.find("Retrieving"), std::string::npos) << "a detail line was logged: " << text;
  EXPECT_EQ(count(text, "\n"), 3u) << text;
  EXPECT_EQ(
      text.rfind("layer build x:1: debootstrap bookworm\nlayer build x:1: creates (10)\nlayer build x:1: done in ", 0),
      0u)
      << text;
  EXPECT_NE(text.find(": 10 created\n"), std::string::npos) << text;
}

TEST(Progress, ATerminalGetsOneStatusLineRewrittenInPlace) {
  std::ostringstream out;
  {
    Progress progress("bench create", out, true);
    progress.step("create and exec", 4);
    progress.step("debootstrap");
    progress.detail("Extracting libc6");
    progress.hold();  // other output follows: the line is cleared
    progress.finish();
  }
  const std::string text = out.str();
  EXPECT_NE(text.find("\rbench create: [1] create and exec 0/4"), std::string::npos) << text;
  EXPECT_NE(text.find("\rbench create: [2] debootstrap: Extracting libc6"), std::string::npos) << text;
  EXPECT_EQ(count(text, "\n"), 1u) << "a terminal got more than the last line: " << text;
  EXPECT_NE(text.find("bench create: done in "), std::string::npos) << text;
  EXPECT_EQ(text.back(), '\n');
}

TEST(Progress, ACommandThatFailsSaysItStopped) {
  std::ostringstream out;
  {
    Progress progress("layer build y:1", out, false);
    progress.step("packing the EROFS image");
  }
  EXPECT_NE(out.str().find("layer build y:1: stopped after "), std::string::npos) << out.str();
  EXPECT_EQ(out.str().find("done"), std::string::npos) << out.str();
}

TEST(Progress, ALongStatusLineIsCutToFitATerminal) {
  std::ostringstream out;
  {
    Progress progress("layer build", out, true);
    progress.step("running " + std::string(300, 'x'));
    progress.finish();
  }
  const std::string text = out.str();
  const size_t start = text.find('\r');
  ASSERT_NE(start, std::string::npos);
  const size_t end = text.find('\r', start + 1);
  EXPECT_LE(end - start - 1, 100u) << text;
  EXPECT_NE(text.find("..."), std::string::npos);
}

}  // namespace
}  // namespace dsec::cli
