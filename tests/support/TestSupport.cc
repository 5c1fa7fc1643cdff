#include "dsec/testing/TestSupport.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "dsec/common/Process.h"
#include "dsec/common/Strings.h"

namespace dsec::testing {

std::string missingRoot() {
  if (geteuid() != 0) return "needs root (namespaces, mounts, cgroups): run the suite as root";
  return "";
}

Result<std::string> makeBusyboxErofs(const std::string& dir, const std::vector<std::string>& applets,
                                     const std::vector<std::string>& extra_dirs) {
  const std::string root = dir + "/rootfs";
  if (std::string why = makeBusyboxRootfs(root, applets); !why.empty()) return Error::internal(why);
  for (const auto& d : extra_dirs) {
    if (mkdir((root + d).c_str(), 0755) != 0 && errno != EEXIST) return Error::sys(errno, "mkdir " + root + d);
  }
  const std::string image = dir + "/layer.erofs";
  auto made = runCommand({"mkfs.erofs", "--quiet", image, root});
  if (!made.ok()) return made.error();
  if (made->exit_code != 0) return Error::internal("mkfs.erofs failed: " + made->output);
  return image;
}

TempDir::TempDir() {
  char tmpl[] = "/tmp/dsec-test-XXXXXX";
  const char* made = mkdtemp(tmpl);
  if (made == nullptr) std::abort();
  path_ = made;
}

TempDir::~TempDir() { (void)removeTree(path_); }

std::string makeBusyboxRootfs(const std::string& root, const std::vector<std::string>& applets) {
  for (const char* d : {"", "/bin", "/etc", "/tmp", "/root", "/proc", "/dev", "/mnt", "/work"}) {
    if (mkdir((root + d).c_str(), 0755) != 0 && errno != EEXIST) return "mkdir " + root + d + ": " + strerror(errno);
  }
  chmod((root + "/tmp").c_str(), 01777);
  auto copied = runCommand({"cp", "/bin/busybox", root + "/bin/busybox"});
  if (!copied.ok() || copied->exit_code != 0) return "cannot copy busybox";
  for (const auto& a : applets) {
    if (symlink("busybox", (root + "/bin/" + a).c_str()) != 0 && errno != EEXIST) {
      return "cannot link the busybox applet " + a + ": " + strerror(errno);
    }
  }
  for (const auto& [file, text] : {std::pair<const char*, const char*>{"/etc/passwd",
                                                                       "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:"
                                                                       "65534:nobody:/:/bin/false\n"},
                                   {"/etc/group", "root:x:0:\nnogroup:x:65534:\n"},
                                   {"/etc/shadow", "root:SANDBOX-SHADOW:19000:0:99999:7:::\n"},
                                   {"/layer-file", "from the layer\n"}}) {
    if (auto st = writeFile(root + file, text); !st.ok()) return st.error().toString();
  }
  return "";
}

}  // namespace dsec::testing
