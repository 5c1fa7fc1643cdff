// The real cgroup file system: plain system calls, every failure an Error carrying errno and the path.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "dsec/common/Cgroup.h"
#include "dsec/common/Directory.h"
#include "dsec/common/Fd.h"
#include "dsec/common/Strings.h"

namespace dsec {
namespace {

class RealCgroupFs final : public CgroupFs {
 public:
  Status makeDir(const std::string& path) override {
    if (::mkdir(path.c_str(), 0755) != 0) return Error::sys(errno, "mkdir " + path);
    return okStatus();
  }

  Status removeDir(const std::string& path) override {
    if (::rmdir(path.c_str()) != 0) return Error::sys(errno, "rmdir " + path);
    return okStatus();
  }

  bool exists(const std::string& path) override { return ::access(path.c_str(), F_OK) == 0; }

  Status writeFile(const std::string& path, const std::string& value) override {
    UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
    if (!fd) return Error::sys(errno, "open " + path);
    // cgroup files take one value per write(2); a short write is an error from the kernel's point of view.
    ssize_t n;
    do {
      n = ::write(fd.get(), value.data(), value.size());
    } while (n < 0 && errno == EINTR);
    if (n < 0) return Error::sys(errno, "write '" + value + "' to " + path);
    if (static_cast<size_t>(n) != value.size()) return Error::sys(EIO, "short write to " + path);
    return okStatus();
  }

  Result<std::string> readFile(const std::string& path) override { return ::dsec::readFile(path); }

  Result<std::vector<std::string>> listDirs(const std::string& path) override {
    DSEC_ASSIGN_OR_RETURN(auto entries, listDirectory(path));
    std::vector<std::string> names;
    for (auto& e : entries) {
      if (e.is_dir) names.push_back(std::move(e.name));
    }
    return names;
  }

  Status signalProcess(pid_t pid, int signal) override {
    if (::kill(pid, signal) != 0 && errno != ESRCH) {
      return Error::sys(errno, "kill " + std::to_string(pid));
    }
    return okStatus();
  }
};

}  // namespace

std::unique_ptr<CgroupFs> makeRealCgroupFs() { return std::make_unique<RealCgroupFs>(); }

}  // namespace dsec
