// The host probe against this host, cross-checked by independent means, and the doctor table's wording.
#include <glob.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>

#include "dsec/common/HostFeatures.h"
#include "dsec/common/Process.h"
#include "dsec/common/Strings.h"
#include "dsec/testing/TestSupport.h"

namespace dsec {
namespace {

bool pathExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// Kernel release as major*100+minor ("6.18.44-fc" -> 618).
int kernelVersion() {
  struct utsname u;
  if (::uname(&u) != 0) return 0;
  int major = 0, minor = 0;
  std::sscanf(u.release, "%d.%d", &major, &minor);
  return major * 100 + minor;
}

class HostFeaturesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { features_ = new HostFeatures(probeHostFeatures()); }
  static void TearDownTestSuite() {
    delete features_;
    features_ = nullptr;
  }
  static HostFeatures* features_;
};
HostFeatures* HostFeaturesTest::features_ = nullptr;

TEST_F(HostFeaturesTest, NamespacesWorkAsRoot) {
  DSEC_SKIP_UNLESS_ROOT();
  const HostFeatures& h = *features_;
  for (const HostFeature* f : {&h.mount_ns, &h.pid_ns, &h.net_ns, &h.uts_ns, &h.ipc_ns, &h.cgroup_ns, &h.user_ns}) {
    EXPECT_TRUE(f->ok()) << f->name << ": " << f->detail;
    EXPECT_NE(f->detail.find("unshare(CLONE_NEW"), std::string::npos) << f->detail;
  }
}

TEST_F(HostFeaturesTest, FilesystemsMatchProcFilesystems) {
  auto text = readFile("/proc/filesystems");
  ASSERT_OK(text);
  // Container sandboxes need both; the suite is meant to run on hosts that have them (Debian 12 and newer kernels).
  EXPECT_TRUE(features_->overlayfs.ok()) << features_->overlayfs.detail;
  EXPECT_TRUE(features_->erofs.ok()) << features_->erofs.detail;
  if (text->find("\terofs\n") != std::string::npos) {
    EXPECT_EQ(features_->erofs.detail, "in /proc/filesystems");
  }
}

TEST_F(HostFeaturesTest, ErofsFileBackedMountOnNewKernels) {
  DSEC_SKIP_UNLESS_ROOT();
  if (findProgram("mkfs.erofs").empty()) {
    EXPECT_EQ(features_->erofs_file_mount.state, FeatureState::kUnknown);
    GTEST_SKIP() << "mkfs.erofs not installed (erofs-utils)";
  }
  if (kernelVersion() < 612) {
    EXPECT_FALSE(features_->erofs_file_mount.ok()) << "file-backed EROFS appeared in Linux 6.12";
    GTEST_SKIP() << "kernel older than 6.12: file-backed EROFS mounts are expected to fail";
  }
  EXPECT_TRUE(features_->erofs_file_mount.ok()) << features_->erofs_file_mount.detail;
  // The probe's temporary directory and mount are gone. Checked in a child with a private /tmp so that
  // probes run by concurrent tests cannot be mistaken for leftovers of this one.
  testing::TempDir private_tmp;
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (::unshare(CLONE_NEWNS) != 0 || ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        ::mount(private_tmp.path().c_str(), "/tmp", nullptr, MS_BIND, nullptr) != 0) {
      ::_exit(2);
    }
    if (!probeHostFeatures().erofs_file_mount.ok()) ::_exit(3);
    glob_t leftovers{};
    bool left = ::glob("/tmp/*", 0, nullptr, &leftovers) == 0;
    ::globfree(&leftovers);
    if (left) ::_exit(4);
    auto mounts = readFile("/proc/self/mountinfo");
    if (!mounts.ok() || mounts->find("dsec-doctor-") != std::string::npos) ::_exit(5);
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "2: no private /tmp, 3: probe failed, 4: a file left in /tmp, 5: a mount left";
}

TEST_F(HostFeaturesTest, CgroupVersionMatchesTheMounts) {
  const HostFeatures& h = *features_;
  ASSERT_TRUE(h.cgroups.ok()) << h.cgroups.detail;
  if (pathExists("/sys/fs/cgroup/cgroup.controllers")) {
    EXPECT_EQ(h.cgroup_version, 2);
    EXPECT_FALSE(h.cgroup_hybrid);
  } else {
    EXPECT_EQ(h.cgroup_version, 1);
    EXPECT_NE(h.cgroups.detail.find("freezer"), std::string::npos) << h.cgroups.detail;
    EXPECT_EQ(h.cgroup_hybrid, pathExists("/sys/fs/cgroup/unified/cgroup.controllers"));
    if (h.cgroup_hybrid) {
      EXPECT_NE(h.cgroups.detail.find("hybrid"), std::string::npos) << h.cgroups.detail;
    }
  }
}

TEST_F(HostFeaturesTest, SecurityFeaturesAreConsistent) {
  const HostFeatures& h = *features_;
  EXPECT_TRUE(h.seccomp.ok()) << h.seccomp.detail;
  if (h.landlock.ok()) {
    EXPECT_GE(h.landlock_abi, 1);
    EXPECT_EQ(h.landlock.detail, "ABI " + std::to_string(h.landlock_abi));
  } else {
    EXPECT_EQ(h.landlock_abi, 0);
  }
  auto lsm = readFile("/sys/kernel/security/lsm");
  if (lsm.ok()) {
    EXPECT_EQ(h.bpf_lsm.ok(), (',' + trim(*lsm) + ',').find(",bpf,") != std::string::npos);
  }
  EXPECT_NE(h.bpf_lsm.state, FeatureState::kUnknown) << h.bpf_lsm.detail;  // securityfs or lsm_list_modules
}

TEST_F(HostFeaturesTest, KvmMatchesDevice) {
  const HostFeatures& h = *features_;
  if (!pathExists("/dev/kvm")) {
    EXPECT_FALSE(h.kvm.ok());
    EXPECT_NE(h.kvm.detail.find("/dev/kvm"), std::string::npos) << h.kvm.detail;
  } else if (::geteuid() == 0) {
    EXPECT_TRUE(h.kvm.ok()) << h.kvm.detail;
    EXPECT_EQ(h.kvm_pvm, pathExists("/sys/module/kvm_pvm"));
    if (h.kvm_pvm) {
      EXPECT_NE(h.kvm.detail.find("PVM"), std::string::npos) << h.kvm.detail;
    }
  }
}

TEST_F(HostFeaturesTest, PsiAndTools) {
  const HostFeatures& h = *features_;
  EXPECT_EQ(h.psi.ok(), readFile("/proc/pressure/memory").ok()) << h.psi.detail;
  EXPECT_EQ(h.mkfs_erofs.ok(), !findProgram("mkfs.erofs").empty()) << h.mkfs_erofs.detail;
  if (h.debootstrap.ok()) {
    EXPECT_NE(h.debootstrap.detail.find("/debootstrap"), std::string::npos);
  }
}

TEST_F(HostFeaturesTest, FormatListsEveryFeatureAndTheVerdict) {
  std::string table = formatHostFeatures(*features_);
  for (const HostFeature* f : features_->all()) {
    EXPECT_NE(table.find(f->name), std::string::npos) << f->name;
    EXPECT_FALSE(f->why.empty()) << f->name;
  }
  EXPECT_NE(table.find("FEATURE"), std::string::npos);
  if (features_->missingRequired().empty()) {
    EXPECT_NE(table.find("Verdict: container sandboxes can run here"), std::string::npos) << table;
  }
}

TEST(HostFeaturesFormatTest, MissingFeaturesSayWhyTheyMatter) {
  HostFeatures h;
  for (const HostFeature* f : h.all()) {
    auto* mutable_f = const_cast<HostFeature*>(f);
    mutable_f->name = "feature-" + std::to_string(reinterpret_cast<uintptr_t>(f) % 100000);
    mutable_f->state = FeatureState::kOk;
    mutable_f->why = "because";
  }
  h.net_ns.name = "network namespace";
  h.net_ns.state = FeatureState::kMissing;
  h.net_ns.required = true;
  h.net_ns.detail = "unshare(CLONE_NEWNET): Operation not permitted";
  h.net_ns.why = "network isolation";
  h.kvm.name = "kvm";
  h.kvm.state = FeatureState::kUnknown;
  h.kvm.detail = "not tried";
  h.kvm.why = "VM sandboxes";
  std::string table = formatHostFeatures(h);
  EXPECT_NE(table.find("network namespace"), std::string::npos);
  EXPECT_NE(table.find("MISSING"), std::string::npos);
  EXPECT_NE(table.find("unshare(CLONE_NEWNET): Operation not permitted"), std::string::npos);
  EXPECT_NE(table.find("  - network namespace (required): network isolation"), std::string::npos) << table;
  EXPECT_NE(table.find("  - kvm (optional): VM sandboxes"), std::string::npos) << table;
  EXPECT_NE(table.find("Verdict: container sandboxes cannot run here; missing: network namespace"), std::string::npos)
      << table;
  EXPECT_EQ(h.missingRequired(), std::vector<std::string>{"network namespace"});
}

}  // namespace
}  // namespace dsec
