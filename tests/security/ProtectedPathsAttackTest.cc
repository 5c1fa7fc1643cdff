// Attack: a policy inside the sandbox changes what grades it (tests, interpreters) once it learns where they are.
// Protected paths are read-only binds in the sandbox's mount namespace, parents bound onto themselves, links
// broken at protect time (backends/container/src/PathProtection.h): every route below must fail and leave the
// protected files as they were, while dsec's own file API still writes them.
#include <unistd.h>

#include <string>

#include "../backends/container/ContainerTestSupport.h"

namespace dsec::testing {
namespace {

constexpr const char* kTest = "/workspace/tests/test_x.py";

class ProtectedPathsAttack : public ContainerTest {
 protected:
  // A workspace as a setup stage leaves it, with a hardlink and a symlink to the test made before protection.
  backends::Sandbox& prepared() {
    auto& sb = create();
    auto r = sh(sb,
                "mkdir -p /workspace/tests /workspace/src && echo original > /workspace/tests/test_x.py && "
                "ln /workspace/tests/test_x.py /workspace/early-hardlink && "
                "ln -s /workspace/tests/test_x.py /tmp/early-symlink && md5sum /bin/busybox > /tmp/busybox.md5");
    EXPECT_EQ(r.exit_code, 0) << r.stderr_data;
    return sb;
  }
  std::string protectedFile(backends::Sandbox& sb) { return sh(sb, std::string("cat ") + kTest).stdout_data; }
  // Runs an attack; it must fail (non-zero) and leave the test file and /bin as they were.
  void attackFails(backends::Sandbox& sb, const std::string& attack) {
    SCOPED_TRACE(attack);
    auto r = sh(sb, attack);
    EXPECT_NE(r.exit_code, 0) << "attack worked: " << r.stdout_data << r.stderr_data;
    EXPECT_EQ(protectedFile(sb), "original\n");
    EXPECT_EQ(sh(sb, "ls -A /workspace/tests").stdout_data, "test_x.py\n");
    EXPECT_EQ(sh(sb, "md5sum -c /tmp/busybox.md5 >/dev/null && echo same").stdout_data, "same\n");
  }
};

TEST_F(ProtectedPathsAttack, EveryRouteToChangeAProtectedFileFails) {
  auto& sb = prepared();
  // A process started before protection, its working directory the protected path's parent.
  auto r = sh(sb,
              "cd /workspace && (while [ ! -e /tmp/go ]; do usleep 10000; done; "
              "echo evil > tests/test_x.py; echo $? > /tmp/early-rc) >/dev/null 2>&1 & echo started");
  ASSERT_EQ(r.stdout_data, "started\n");
  ASSERT_OK(sb.setProtectedPaths({"/workspace/tests", "/bin"}));

  const char* attacks[] = {
      // direct writes, truncation, new files, metadata
      "echo evil > /workspace/tests/test_x.py",
      "echo evil >> /workspace/tests/test_x.py",
      ": > /workspace/tests/test_x.py",
      "dd if=/dev/zero of=/workspace/tests/test_x.py bs=1 count=1 conv=notrunc",
      "touch /workspace/tests/new_test.py",
      "mkdir /workspace/tests/sub",
      "chmod 777 /workspace/tests/test_x.py",
      "touch -d '2001-01-01 00:00' /workspace/tests/test_x.py",
      // removal and replacement
      "rm -f /workspace/tests/test_x.py",
      "rm -rf /workspace/tests",
      "echo evil > /tmp/f && mv /tmp/f /workspace/tests/test_x.py",
      "mkdir -p /workspace/x && echo evil > /workspace/x/f && mv -f /workspace/x/f /workspace/tests/test_x.py",
      "mkdir -p /tmp/fake && echo evil > /tmp/fake/test_x.py && rm -rf /workspace/tests; mv /tmp/fake /workspace/tests",
      // renaming the protected directory or a parent and putting another tree at its path
      "mv /workspace/tests /workspace/tests-old && mkdir /workspace/tests && echo evil > /workspace/tests/test_x.py",
      "mv /workspace /workspace-old && mkdir -p /workspace/tests && echo evil > /workspace/tests/test_x.py",
      "cd /workspace && mv tests ../moved",
      // symlinks and hardlinks, made after and before protection
      "ln -s /workspace/tests/test_x.py /tmp/sym && echo evil > /tmp/sym",
      "echo evil > /tmp/early-symlink",
      "ln /workspace/tests/test_x.py /workspace/late-hardlink && echo evil > /workspace/late-hardlink",
      // mount tricks as sandbox root
      "umount /workspace/tests",
      "umount -l /workspace/tests",
      "umount /workspace",
      "mount -o remount,rw /workspace/tests",
      "mount -t tmpfs none /workspace/tests",
      "mkdir -p /tmp/w && echo evil > /tmp/w/test_x.py && mount --bind /tmp/w /workspace/tests",
      "unshare -m sh -c 'umount -l /workspace/tests; echo evil > /workspace/tests/test_x.py'",
      "unshare -Urm sh -c 'umount -l /workspace/tests; echo evil > /workspace/tests/test_x.py'",
      // replacing a binary of a protected system directory
      "echo evil > /bin/busybox",
      "cat /bin/busybox > /tmp/bb && echo x >> /tmp/bb && cat /tmp/bb > /bin/busybox",
      "cp /bin/busybox /tmp/bb && mv /tmp/bb /bin/busybox",
      "rm -f /bin/sh",
      "ln -sf /tmp/evil /bin/cat",
      "mv /bin /bin-old",
  };
  for (const char* attack : attacks) attackFails(sb, attack);

  // The hardlink made before protection no longer reaches the protected file's data.
  sh(sb, "echo evil > /workspace/early-hardlink");
  EXPECT_EQ(protectedFile(sb), "original\n");

  // The process from before protection, writing relative to its old working directory, is refused too.
  sh(sb, "touch /tmp/go");
  for (int i = 0; i < 2000 && sh(sb, "cat /tmp/early-rc").stdout_data.empty(); ++i) usleep(10000);
  EXPECT_NE(sh(sb, "cat /tmp/early-rc").stdout_data, "0\n");
  EXPECT_EQ(protectedFile(sb), "original\n");
  // Reading still works.
  EXPECT_EQ(sh(sb, "cat /workspace/tests/test_x.py && ls /bin/sh").exit_code, 0);
}

TEST_F(ProtectedPathsAttack, ProtectionAtCreateHoldsFromTheFirstCommand) {
  auto spec = makeSpec();
  spec.protected_paths = {"/etc", "/bin"};
  auto& sb = create(spec);
  for (const char* attack : {"echo 'evil:x:0:0::/:/bin/sh' >> /etc/passwd", "rm -rf /etc", "mv /etc /etc2",
                             "umount /etc", "echo evil > /bin/busybox"}) {
    SCOPED_TRACE(attack);
    EXPECT_NE(sh(sb, attack).exit_code, 0);
  }
  EXPECT_EQ(sh(sb, "grep -c evil /etc/passwd").stdout_data, "0\n");
}

}  // namespace
}  // namespace dsec::testing
