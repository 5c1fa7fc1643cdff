// common/Directory.h and common/FdIo.h: listings (types without following symlinks, errors, an fd's offset left
// alone), whole-buffer writes through a pipe larger than its buffer, and a send to a closed peer that is an
// EPIPE error, not a SIGPIPE.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <thread>

#include "dsec/common/Directory.h"
#include "dsec/common/Fd.h"
#include "dsec/common/FdIo.h"
#include "dsec/common/Strings.h"
#include "dsec/testing/TestSupport.h"

namespace dsec {
namespace {

std::vector<std::pair<std::string, bool>> sorted(const std::vector<DirEntry>& entries) {
  std::vector<std::pair<std::string, bool>> out;
  for (const auto& e : entries) out.emplace_back(e.name, e.is_dir);
  std::sort(out.begin(), out.end());
  return out;
}

TEST(Directory, ListsEntriesWithTheirKindAndNeverFollowsSymlinks) {
  testing::TempDir dir;
  ASSERT_OK(writeFile(dir.path() + "/file", "x"));
  ASSERT_OK(makeDirs(dir.path() + "/sub"));
  ASSERT_EQ(::symlink("sub", (dir.path() + "/link").c_str()), 0);
  auto listed = listDirectory(dir.path());
  ASSERT_OK(listed);
  const std::vector<std::pair<std::string, bool>> want = {{"file", false}, {"link", false}, {"sub", true}};
  EXPECT_EQ(sorted(*listed), want);

  UniqueFd fd(::open(dir.path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  ASSERT_TRUE(fd);
  for (int i = 0; i < 2; ++i) {  // the caller's fd (and its offset) is untouched: the same listing twice
    auto at = listDirectoryAt(fd.get(), dir.path());
    ASSERT_OK(at);
    EXPECT_EQ(sorted(*at), want);
  }
  EXPECT_TRUE(listDirectory(dir.path() + "/sub")->empty());
}

TEST(Directory, ErrorsNameThePath) {
  testing::TempDir dir;
  auto missing = listDirectory(dir.path() + "/nope");
  ASSERT_ERROR(missing, ErrorCode::kNotFound);
  EXPECT_NE(missing.error().message().find(dir.path() + "/nope"), std::string::npos);
  ASSERT_OK(writeFile(dir.path() + "/file", "x"));
  auto not_dir = listDirectory(dir.path() + "/file");
  ASSERT_FALSE(not_dir.ok());
  EXPECT_EQ(not_dir.error().sysErrno(), ENOTDIR);
}

TEST(FdIo, WritesEveryByteThroughAPipeSmallerThanTheData) {
  int fds[2];
  ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0);
  UniqueFd r(fds[0]), w(fds[1]);
  std::string data(4 << 20, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7);
  std::string got;
  std::thread reader([&] {
    char buf[65536];
    for (ssize_t n; (n = ::read(r.get(), buf, sizeof buf)) > 0;) got.append(buf, static_cast<size_t>(n));
  });
  EXPECT_OK(writeAll(w.get(), data, "the pipe"));
  w.reset();
  reader.join();
  EXPECT_TRUE(got == data);
}

TEST(FdIo, SendToAClosedPeerIsAnErrorNotASignal) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  UniqueFd ours(sv[0]);
  ::close(sv[1]);
  auto st = sendAll(ours.get(), "hello", "to the peer");  // would kill the test with SIGPIPE without MSG_NOSIGNAL
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().sysErrno(), EPIPE);
  EXPECT_NE(st.error().message().find("send to the peer"), std::string::npos) << st.error().message();
  auto bad = writeAll(-1, "x", "nowhere");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().sysErrno(), EBADF);
}

}  // namespace
}  // namespace dsec
