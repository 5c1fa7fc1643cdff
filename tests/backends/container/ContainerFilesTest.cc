// The file API: resolved inside the sandbox root from outside; symlinks planted inside cannot escape.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include "ContainerTestSupport.h"
#include "dsec/common/Strings.h"

namespace dsec::testing {
namespace {

std::string readAll(int fd) {
  std::string out;
  char buf[65536];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  return out;
}

Status writeAll(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = write(fd, data.data(), data.size());
    if (n < 0) return Error::sys(errno, "write");
    data.remove_prefix(static_cast<size_t>(n));
  }
  return okStatus();
}

TEST_F(ContainerTest, WriteReadListStatRemove) {
  auto& sb = create();
  {
    auto fd = sb.openForWrite("/work/deep/dir/a.txt", 0640);
    ASSERT_OK(fd);
    ASSERT_OK(writeAll(fd->get(), "hello file\n"));
  }
  EXPECT_EQ(sh(sb, "cat /work/deep/dir/a.txt; stat -c %a /work/deep/dir/a.txt").stdout_data, "hello file\n640\n");
  sh(sb, "echo from-inside > /work/b.txt; ln -s a.txt /work/deep/dir/link");
  auto rd = sb.openForRead("/work/b.txt");
  ASSERT_OK(rd);
  EXPECT_EQ(readAll(rd->get()), "from-inside\n");

  auto st = sb.stat("/work/deep/dir/a.txt");
  ASSERT_OK(st);
  EXPECT_EQ(st->name, "a.txt");
  EXPECT_EQ(st->type, "file");
  EXPECT_EQ(st->size, 11);
  EXPECT_EQ(st->mode, 0640u);
  EXPECT_GT(st->mtime, 0);
  auto link = sb.stat("/work/deep/dir/link");
  ASSERT_OK(link);
  EXPECT_EQ(link->type, "symlink");
  auto dir = sb.stat("/work//deep/./dir/");
  ASSERT_OK(dir);
  EXPECT_EQ(dir->type, "dir");

  auto list = sb.listDir("/work");
  ASSERT_OK(list);
  std::set<std::string> names;
  for (const auto& e : *list) names.insert(e.name + ":" + e.type);
  EXPECT_EQ(names, (std::set<std::string>{"b.txt:file", "deep:dir"}));

  ASSERT_ERROR(sb.stat("/nope"), ErrorCode::kNotFound);
  ASSERT_ERROR(sb.openForRead("/work"), ErrorCode::kInvalidArgument);
  for (const char* bad : {"", "relative", "/work/../etc/passwd", "/a/.."}) {
    SCOPED_TRACE(bad);
    ASSERT_ERROR(sb.stat(bad), ErrorCode::kInvalidArgument);
  }
  ASSERT_ERROR(sb.stat(std::string("/a\0b", 4)), ErrorCode::kInvalidArgument);

  ASSERT_ERROR(sb.remove("/work/deep", false), ErrorCode::kConflict);
  ASSERT_OK(sb.remove("/work/b.txt", false));
  ASSERT_OK(sb.remove("/work/deep", true));
  ASSERT_ERROR(sb.remove("/work/deep", true), ErrorCode::kNotFound);
  ASSERT_ERROR(sb.remove("/", true), ErrorCode::kInvalidArgument);
  EXPECT_EQ(sh(sb, "ls -A /work").stdout_data, "");
}

TEST_F(ContainerTest, LargeFileIsStreamed) {
  auto& sb = create();
  constexpr size_t kSize = 50 << 20;
  std::string chunk(1 << 20, '\0');
  for (size_t i = 0; i < chunk.size(); ++i) chunk[i] = static_cast<char>('a' + i % 26);
  {
    auto fd = sb.openForWrite("/big.bin", 0644);
    ASSERT_OK(fd);
    for (size_t done = 0; done < kSize; done += chunk.size()) ASSERT_OK(writeAll(fd->get(), chunk));
  }
  EXPECT_EQ(trim(sh(sb, "wc -c < /big.bin").stdout_data), std::to_string(kSize));
  auto fd = sb.openForRead("/big.bin");
  ASSERT_OK(fd);
  std::string buf(chunk.size(), '\0');
  size_t total = 0;
  for (;;) {
    ssize_t n = read(fd->get(), buf.data(), buf.size());
    ASSERT_GE(n, 0);
    if (n == 0) break;
    ASSERT_EQ(0, memcmp(buf.data(), chunk.data() + (total % chunk.size()), static_cast<size_t>(n)));
    total += static_cast<size_t>(n);
  }
  EXPECT_EQ(total, kSize);
}

TEST_F(ContainerTest, SymlinksCannotEscapeTheSandbox) {
  auto& sb = create();
  std::string host_target = "/tmp/dsec-ct-host-" + randomHex(8);
  ASSERT_EQ(access(host_target.c_str(), F_OK), -1);
  auto made = sh(sb,
                 "ln -s /etc/shadow /tmp/x; ln -s ../../../../../etc/shadow /tmp/rel; "
                 "ln -s " +
                     host_target +
                     " /tmp/w; ln -s /proc/self/root/etc/hostname /tmp/magic; "
                     "ln -s /tmp /tmp/dirlink; mkdir -p /d; ln -s /bin /d/binlink");
  ASSERT_EQ(made.exit_code, 0) << made.stderr_data;

  for (const char* p : {"/tmp/x", "/tmp/rel"}) {
    auto fd = sb.openForRead(p);
    ASSERT_OK(fd);
    EXPECT_EQ(readAll(fd->get()), "root:SANDBOX-SHADOW:19000:0:99999:7:::\n") << p;
  }
  {
    auto fd = sb.openForWrite("/tmp/w", 0644);  // dangling link to a host path: created inside
    ASSERT_OK(fd);
    ASSERT_OK(writeAll(fd->get(), "inside\n"));
  }
  EXPECT_EQ(access(host_target.c_str(), F_OK), -1) << "write escaped to the host";
  EXPECT_EQ(sh(sb, "cat " + host_target).stdout_data, "inside\n");
  EXPECT_FALSE(sb.openForRead("/tmp/magic").ok());             // /proc magic links are refused
  EXPECT_FALSE(sb.openForRead("/proc/1/environ").ok());        // other mounts are not crossed
  auto via_dir = sb.openForWrite("/tmp/dirlink/sub/f", 0644);  // parents resolved inside too
  ASSERT_OK(via_dir);
  EXPECT_EQ(sh(sb, "test -f /tmp/sub/f && echo ok").stdout_data, "ok\n");
  ASSERT_OK(sb.remove("/d", true));  // does not follow the link into /bin
  EXPECT_EQ(sh(sb, "test -x /bin/busybox && echo ok").stdout_data, "ok\n");
}

}  // namespace
}  // namespace dsec::testing
