#include "FncallTestSupport.h"

#include <dirent.h>
#include <unistd.h>

#include <fstream>
#include <mutex>
#include <set>

#include "dsec/backends/container/ContainerBackend.h"
#include "dsec/common/Strings.h"

namespace dsec::testing {
namespace {

struct ImageHolder {
  std::unique_ptr<PythonTestImage> image;
  std::string skip_reason;
  std::string error;
};

ImageHolder& holder() {
  static ImageHolder h;
  static std::once_flag once;
  std::call_once(once, [] {
    h.skip_reason = missingPythonRootfsTools();
    if (!h.skip_reason.empty()) return;
    auto made = PythonTestImage::make();
    if (!made.ok()) {
      if (made.error().code() == ErrorCode::kUnsupported) {
        h.skip_reason = made.error().message();
      } else {
        h.error = made.error().toString();
      }
      return;
    }
    h.image = std::move(*made);
  });
  return h;
}

std::vector<std::string> listDir(const std::string& path) {
  std::vector<std::string> out;
  DIR* d = opendir(path.c_str());
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name != "." && name != "..") out.push_back(name);
  }
  closedir(d);
  return out;
}

}  // namespace

const std::string& fncallTestCgroupParent() {
  static const std::string parent = "dsec-test-fn-" + std::to_string(getpid());
  return parent;
}

PythonTestImage* FncallTest::image() { return holder().image.get(); }

void FncallTest::SetUp() {
  ImageHolder& h = holder();
  if (!h.skip_reason.empty()) GTEST_SKIP() << h.skip_reason;
  ASSERT_TRUE(h.error.empty()) << h.error;
  backends::ContainerBackendOptions bo;
  bo.cgroup_parent = fncallTestCgroupParent();
  auto b = backends::makeContainerBackend(bo);
  ASSERT_TRUE(b.ok()) << b.error().toString();
  backend_ = std::move(*b);
  auto missing = backend_->missingFeatures();
  if (!missing.empty()) GTEST_SKIP() << "host lacks: " << missing[0];
  options_.default_image = PythonTestImage::kImage;
  options_.node_name = "t";
  options_.max_workers = 4;
  options_.min_idle_workers = 1;
  options_.queue_wait_seconds = 120;  // a loaded 2-core machine may take long to start workers
  options_.idle_shrink_seconds = 60;
  options_.worker_pids = 64;
  options_.prewarm_default = false;
}

void FncallTest::TearDown() {
  if (service_) {
    service_->shutdown();
    service_.reset();
    expectNothingLeft();
  }
  backend_.reset();
  // The per-process parents (empty by now) in every hierarchy.
  for (const auto& controller : listDir("/sys/fs/cgroup")) {
    ::rmdir(("/sys/fs/cgroup/" + controller + "/" + fncallTestCgroupParent()).c_str());
  }
  ::rmdir(("/sys/fs/cgroup/" + fncallTestCgroupParent()).c_str());
}

void FncallTest::startService() {
  auto s = backends::fncall::FunctionService::start(options_, makeTestWorkerFactory(backend_.get(), image()));
  ASSERT_TRUE(s.ok()) << s.error().toString();
  service_ = std::move(*s);
}

backends::fncall::CallRequest FncallTest::python(const std::string& code) {
  backends::fncall::CallRequest r;
  r.language = backends::fncall::Language::kPython;
  r.code = code;
  r.timeout_seconds = 60;
  return r;
}

backends::fncall::CallRequest FncallTest::bash(const std::string& code) {
  auto r = python(code);
  r.language = backends::fncall::Language::kBash;
  return r;
}

backends::ExecResult FncallTest::run(const backends::fncall::CallRequest& request) {
  auto r = service_->call(request);
  if (!r.ok()) {
    ADD_FAILURE() << "call failed: " << r.error().toString() << "\ncode: " << request.code;
    return {};
  }
  return std::move(*r);
}

std::vector<std::string> FncallTest::workerCgroups() {
  std::set<std::string> ids;
  std::vector<std::string> dirs = {std::string("/sys/fs/cgroup/") + fncallTestCgroupParent()};
  for (const auto& controller : listDir("/sys/fs/cgroup")) {
    dirs.push_back("/sys/fs/cgroup/" + controller + "/" + fncallTestCgroupParent());
  }
  for (const auto& dir : dirs) {
    for (const auto& id : listDir(dir)) {
      if (access((dir + "/" + id + "/cgroup.procs").c_str(), F_OK) == 0) ids.insert(id);
    }
  }
  return {ids.begin(), ids.end()};
}

std::vector<pid_t> FncallTest::zygotePids() {
  std::vector<pid_t> pids;
  const std::string me = std::to_string(getpid());
  for (const auto& name : listDir("/proc")) {
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    auto stat = readFile("/proc/" + name + "/stat");
    if (!stat.ok()) continue;
    size_t paren = stat->rfind(')');
    if (paren == std::string::npos) continue;
    auto fields = split(stat->substr(paren + 2), ' ');
    if (fields.size() < 2 || fields[1] != me) continue;
    auto cmdline = readFile("/proc/" + name + "/cmdline");
    if (cmdline.ok() && cmdline->find("fncall zygote") != std::string::npos) pids.push_back(std::stoi(name));
  }
  return pids;
}

// CPU time of every worker sandbox (v1 cpuacct.usage; v2 cpu.stat usage_usec).
double FncallTest::workerCpuSeconds() {
  double total = 0;
  for (const auto& id : workerCgroups()) {
    for (const char* dir : {"/sys/fs/cgroup/cpu,cpuacct/", "/sys/fs/cgroup/cpuacct/"}) {
      auto v = readFile(std::string(dir) + fncallTestCgroupParent() + "/" + id + "/cpuacct.usage");
      if (v.ok()) {
        total += std::stod(*v) / 1e9;
        break;
      }
    }
    auto st = readFile(std::string("/sys/fs/cgroup/") + fncallTestCgroupParent() + "/" + id + "/cpu.stat");
    if (st.ok() && st->find("usage_usec ") != std::string::npos) {
      total += std::stod(st->substr(st->find("usage_usec ") + 11)) / 1e6;
    }
  }
  return total;
}

void FncallTest::expectNothingLeft() {
  EXPECT_TRUE(workerCgroups().empty()) << "worker cgroups left: " << workerCgroups()[0];
  EXPECT_TRUE(zygotePids().empty()) << "zygotes left";
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  while (std::getline(in, line)) {
    EXPECT_EQ(line.find("/run/dsec/container-root"), std::string::npos) << line;
    EXPECT_EQ(line.find("-fn-"), std::string::npos) << line;
  }
}

}  // namespace dsec::testing
