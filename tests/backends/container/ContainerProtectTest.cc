// Protected paths (backends/container/src/PathProtection.h): changed at runtime, refused on bad input, kept across
// adoption, and never in the way of the file API. The attacks themselves are in tests/security.
#include <gtest/gtest.h>
#include <unistd.h>

#include "ContainerTestSupport.h"

namespace dsec::testing {
namespace {

Status writeText(backends::Sandbox& sb, const std::string& path, const std::string& text) {
  DSEC_ASSIGN_OR_RETURN(UniqueFd fd, sb.openForWrite(path, 0644));
  if (write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size())) return Error::sys(errno, "write");
  return okStatus();
}

class ContainerProtectTest : public ContainerTest {
 protected:
  backends::Sandbox& workspace() {
    auto& sb = create();
    EXPECT_EQ(sh(sb, "mkdir -p /workspace/tests /workspace/src && echo original > /workspace/tests/t.py").exit_code, 0);
    return sb;
  }
  bool writable(backends::Sandbox& sb, const std::string& path) {
    return sh(sb, "echo inside > " + path).exit_code == 0;
  }
};

TEST_F(ContainerProtectTest, FileApiWritesProtectedPaths) {
  auto& sb = workspace();
  ASSERT_OK(sb.setProtectedPaths({"/workspace/tests"}));
  ASSERT_FALSE(writable(sb, "/workspace/tests/t.py"));
  // The grader's writes: over a protected file, a new file, a new directory, below a bound parent.
  ASSERT_OK(writeText(sb, "/workspace/tests/t.py", "graded\n"));
  ASSERT_OK(writeText(sb, "/workspace/tests/new/n.py", "new\n"));
  ASSERT_OK(writeText(sb, "/workspace/src/a.py", "src\n"));
  EXPECT_EQ(sh(sb, "cat /workspace/tests/t.py /workspace/tests/new/n.py /workspace/src/a.py").stdout_data,
            "graded\nnew\nsrc\n");
  auto st = sb.stat("/workspace/tests");
  ASSERT_OK(st);
  EXPECT_EQ(st->type, "dir");
  auto list = sb.listDir("/workspace/tests");
  ASSERT_OK(list);
  EXPECT_EQ(list->size(), 2u);
  ASSERT_OK(sb.remove("/workspace/tests/new", true));
  EXPECT_EQ(sh(sb, "ls /workspace/tests").stdout_data, "t.py\n");
  // Still no way out of the sandbox through a symlink inside the protected tree.
  sh(sb, "ln -s /etc /workspace/tests/esc 2>/dev/null; true");
  ASSERT_OK(sb.setProtectedPaths({}));
  sh(sb, "ln -s /etc /workspace/tests/esc");
  ASSERT_OK(sb.setProtectedPaths({"/workspace/tests"}));
  // Inside a protected tree the file API resolves symlinks within that tree: this one leads nowhere.
  ASSERT_ERROR(writeText(sb, "/workspace/tests/esc/planted", "x\n"), ErrorCode::kNotFound);
  EXPECT_EQ(access("/etc/planted", F_OK), -1);
  EXPECT_NE(sh(sb, "cat /etc/planted").exit_code, 0);
  // Still protected from inside afterwards.
  EXPECT_FALSE(writable(sb, "/workspace/tests/t.py"));
}

TEST_F(ContainerProtectTest, ChangedAndLiftedAtRuntime) {
  auto& sb = workspace();
  ASSERT_OK(sb.setProtectedPaths({"/workspace/tests"}));
  EXPECT_FALSE(writable(sb, "/workspace/tests/t.py"));
  EXPECT_TRUE(writable(sb, "/etc/motd"));
  // A new list: the old path is writable again, the new one is not.
  ASSERT_OK(sb.setProtectedPaths({"/etc", "/workspace/src"}));
  EXPECT_TRUE(writable(sb, "/workspace/tests/t.py"));
  EXPECT_FALSE(writable(sb, "/etc/motd"));
  EXPECT_FALSE(writable(sb, "/workspace/src/x"));
  EXPECT_NE(sh(sb, "mv /workspace /w2").exit_code, 0);
  // Nested paths: the outer one covers the inner.
  ASSERT_OK(sb.setProtectedPaths({"/workspace", "/workspace/tests"}));
  EXPECT_FALSE(writable(sb, "/workspace/tests/t.py"));
  EXPECT_FALSE(writable(sb, "/workspace/other"));
  EXPECT_TRUE(writable(sb, "/etc/motd"));
  // Lifted: everything is as before, parents can be renamed again.
  ASSERT_OK(sb.setProtectedPaths({}));
  EXPECT_TRUE(writable(sb, "/workspace/tests/t.py"));
  EXPECT_EQ(sh(sb, "mv /workspace /w2 && mv /w2 /workspace && rm -rf /workspace/tests && echo ok").stdout_data, "ok\n");
  EXPECT_EQ(sh(sb, "grep -c ' /workspace' /proc/self/mountinfo").stdout_data, "0\n");
}

TEST_F(ContainerProtectTest, BadInputIsRefusedAndChangesNothing) {
  auto& sb = workspace();
  ASSERT_OK(sb.setProtectedPaths({"/workspace/tests"}));
  sh(sb, "ln -s /workspace /link");
  struct Bad {
    std::vector<std::string> paths;
    ErrorCode code;
  };
  const Bad bad[] = {{{"workspace/src"}, ErrorCode::kInvalidArgument},
                     {{"/workspace/../etc"}, ErrorCode::kInvalidArgument},
                     {{"/"}, ErrorCode::kInvalidArgument},
                     {{"/etc", ""}, ErrorCode::kInvalidArgument},
                     {{"/link/src"}, ErrorCode::kInvalidArgument},
                     {{"/etc/passwd/x"}, ErrorCode::kInvalidArgument},
                     {{"/etc", "/no/such/dir"}, ErrorCode::kNotFound}};
  for (const auto& b : bad) {
    SCOPED_TRACE(b.paths.back());
    ASSERT_ERROR(sb.setProtectedPaths(b.paths), b.code);
    EXPECT_FALSE(writable(sb, "/workspace/tests/t.py"));
    EXPECT_TRUE(writable(sb, "/etc/motd"));
  }
  auto spec = makeSpec();
  spec.protected_paths = {"/no/such/dir"};
  ASSERT_ERROR(backend_->create(spec), ErrorCode::kNotFound);
  EXPECT_TRUE(cgroupDirsOf(spec.id).empty());
  spec.protected_paths = {"relative"};
  ASSERT_ERROR(backend_->create(spec), ErrorCode::kInvalidArgument);
}

TEST_F(ContainerProtectTest, ProtectionSurvivesAdoption) {
  auto spec = makeSpec();
  spec.protected_paths = {"/etc"};
  nlohmann::json state;
  {
    auto sb = backend_->create(spec);
    ASSERT_OK(sb);
    ASSERT_OK((*sb)->setProtectedPaths({"/etc", "/bin"}));
    state = (*sb)->persistentState();
  }
  backend_.reset();
  backend_ = newBackend();
  auto adopted = backend_->adopt(nlohmann::json::parse(state.dump()));
  ASSERT_OK(adopted);
  auto& sb = **adopted;
  EXPECT_FALSE(writable(sb, "/etc/passwd"));
  EXPECT_FALSE(writable(sb, "/bin/busybox"));
  ASSERT_OK(writeText(sb, "/etc/graded", "by the grader\n"));
  EXPECT_EQ(sh(sb, "cat /etc/graded").stdout_data, "by the grader\n");
  EXPECT_EQ(sb.persistentState().at("protected_paths"), nlohmann::json({"/bin", "/etc"}));
  // The adopted list is the one changed: lifting it unmounts what the first agent mounted.
  ASSERT_OK(sb.setProtectedPaths({"/bin"}));
  EXPECT_TRUE(writable(sb, "/etc/passwd"));
  EXPECT_FALSE(writable(sb, "/bin/busybox"));
  ASSERT_OK(sb.destroy());
}

}  // namespace
}  // namespace dsec::testing
