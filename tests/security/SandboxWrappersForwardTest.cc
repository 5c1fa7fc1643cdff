// Attack: a limit silently dropped by a wrapper. A Sandbox wrapper that forgets an operation (the launcher's
// MountedSandbox once forgot setMemoryLimit, so `memory=` on a call did nothing) turns a limit the caller
// asked for into a no-op. This test puts a recording fake under every wrapper type in the tree, calls every
// operation of the interface through the wrapper and checks that each reached the fake with its arguments
// and that its result came back. It fails when:
//  - an operation declared in Sandbox.h has no check here (the list below is compared with the header),
//  - a class in the product's sources derives from ForwardingSandbox but is not in the wrapper list below,
//  - a class derives from Sandbox directly without being a known backend sandbox (wrappers must derive
//    from ForwardingSandbox).
// Every operation of Sandbox is pure virtual, so a wrapper (or this fake) that lacks one does not compile.
#include <gtest/gtest.h>
#include <sys/eventfd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "dsec/backends/ForwardingSandbox.h"
#include "dsec/launcher/node/NodeFncall.h"

namespace dsec::testing {
namespace {

using backends::ExecRequest;
using backends::ExecResult;
using backends::ExecSink;
using backends::FileStat;
using backends::LongRunningProcess;
using backends::Sandbox;
using backends::SandboxSpec;
using backends::SandboxState;
using backends::SandboxUsage;

// Records every operation with its arguments as one line, and answers with values a test can recognise.
class RecordingSandbox : public Sandbox {
 public:
  explicit RecordingSandbox(std::vector<std::string>* log) : log_(log) { spec_.id = "recorded-42"; }

  const SandboxSpec& spec() const override {
    note("spec");
    return spec_;
  }
  SandboxState state() const override {
    note("state");
    return SandboxState::kPaused;
  }
  std::string backendName() const override {
    note("backendName");
    return "recording";
  }
  Result<ExecResult> exec(const ExecRequest& request) override {
    note("exec " + describe(request));
    ExecResult r;
    r.exit_code = 17;
    r.stdout_data = "exec-out";
    return r;
  }
  Result<ExecResult> execStream(const ExecRequest& request, ExecSink& sink) override {
    note("execStream " + describe(request));
    sink.onStdout("streamed", 8);
    ExecResult r;
    r.exit_code = 18;
    return r;
  }
  bool supportsStdinFd() const override {
    note("supportsStdinFd");
    return true;
  }
  Result<LongRunningProcess> spawn(const ExecRequest& request) override {
    note("spawn " + describe(request));
    LongRunningProcess p;
    p.pid = 4242;
    return p;
  }
  Status setMemoryLimit(int64_t bytes) override {
    note("setMemoryLimit " + std::to_string(bytes));
    return Error(ErrorCode::kResourceExhausted, "recorded limit");
  }
  Status setEgress(const backends::EgressPolicy& policy) override {
    std::string rules;
    for (const auto& text : policy.texts()) rules += " " + text;
    note("setEgress" + rules);
    return Error(ErrorCode::kConflict, "recorded egress");
  }
  Status setProtectedPaths(const std::vector<std::string>& paths) override {
    std::string list;
    for (const auto& path : paths) list += " " + path;
    note("setProtectedPaths" + list);
    return Error(ErrorCode::kUnsupported, "recorded protect");
  }
  Result<std::vector<backends::Violation>> violations() override {
    note("violations");
    backends::Violation v;
    v.kind = backends::ViolationKind::kDns;
    v.target = "recorded.example";
    return std::vector<backends::Violation>{v};
  }
  Result<UniqueFd> openForRead(const std::string& path) override {
    note("openForRead " + path);
    return UniqueFd(eventfd(7, EFD_CLOEXEC));
  }
  Result<UniqueFd> openForWrite(const std::string& path, uint32_t mode) override {
    note("openForWrite " + path + " " + std::to_string(mode));
    return UniqueFd(eventfd(8, EFD_CLOEXEC));
  }
  Result<FileStat> stat(const std::string& path) override {
    note("stat " + path);
    FileStat st;
    st.name = "stat-name";
    st.size = 99;
    return st;
  }
  Result<std::vector<FileStat>> listDir(const std::string& path) override {
    note("listDir " + path);
    return std::vector<FileStat>(3);
  }
  Status remove(const std::string& path, bool recursive) override {
    note("remove " + path + (recursive ? " recursive" : " single"));
    return Error::notFound("recorded remove");
  }
  Status pause() override {
    note("pause");
    return Error(ErrorCode::kConflict, "recorded pause");
  }
  Status resume() override {
    note("resume");
    return Error(ErrorCode::kConflict, "recorded resume");
  }
  Status reclaimMemory() override {
    note("reclaimMemory");
    return Error(ErrorCode::kSystem, "recorded reclaim");
  }
  Status destroy() override {
    note("destroy");
    // The error comes back once (what the check looks for); a wrapper's own teardown then succeeds.
    if (destroyed_++ == 0) return Error(ErrorCode::kTimeout, "recorded destroy");
    return okStatus();
  }
  Result<SandboxUsage> usage() override {
    note("usage");
    SandboxUsage u;
    u.memory_bytes = 1234;
    u.oom_kills = 5;
    return u;
  }
  Result<backends::SnapshotKind> snapshot(const std::string& dir) override {
    note("snapshot " + dir);
    return backends::SnapshotKind::kMachine;
  }
  nlohmann::json persistentState() const override {
    note("persistentState");
    return {{"rec", 1}};
  }

 private:
  static std::string describe(const ExecRequest& r) {
    std::string s;
    for (const auto& a : r.argv) s += a + ",";
    s += " cwd=" + r.cwd + " stdin=" + r.stdin_data + " stdin_fd=" + std::to_string(r.stdin_fd) +
         " timeout=" + std::to_string(r.timeout_seconds) + " cap=" + std::to_string(r.output_cap) +
         " tty=" + std::to_string(r.tty) + ":" + std::to_string(r.tty_rows) + "x" + std::to_string(r.tty_cols);
    for (const auto& [k, v] : r.env) s += " " + k + "=" + v;
    return s;
  }
  void note(const std::string& line) const { log_->push_back(line); }

  std::vector<std::string>* log_;
  SandboxSpec spec_;
  int destroyed_ = 0;
};

class CountingSink : public ExecSink {
 public:
  bool onStdout(const char* data, size_t size) override {
    out.append(data, size);
    return true;
  }
  bool onStderr(const char*, size_t) override { return true; }
  std::string out;
};

ExecRequest sampleRequest() {
  ExecRequest r;
  r.argv = {"prog", "arg1"};
  r.cwd = "/w";
  r.stdin_data = "in";
  r.stdin_fd = 3;
  r.timeout_seconds = 2.5;
  r.output_cap = 77;
  r.tty = true;
  r.tty_rows = 30;
  r.tty_cols = 100;
  r.env = {{"K", "V"}};
  return r;
}
const char* kSampleDescription = "prog,arg1, cwd=/w stdin=in stdin_fd=3 timeout=2.500000 cap=77 tty=1:30x100 K=V";

// One check per operation: call it through `s` and return what the wrapped fake must have recorded; the
// check itself verifies that the fake's answer came back unchanged.
struct Operation {
  std::string name;
  std::function<std::string(Sandbox& s)> call;
};

std::vector<Operation> operations() {
  return {
      {"spec",
       [](Sandbox& s) {
         EXPECT_EQ(s.spec().id, "recorded-42");
         return "spec";
       }},
      {"state",
       [](Sandbox& s) {
         EXPECT_EQ(s.state(), SandboxState::kPaused);
         return "state";
       }},
      {"backendName",
       [](Sandbox& s) {
         EXPECT_EQ(s.backendName(), "recording");
         return "backendName";
       }},
      {"exec",
       [](Sandbox& s) {
         auto r = s.exec(sampleRequest());
         EXPECT_TRUE(r.ok() && r->exit_code == 17 && r->stdout_data == "exec-out");
         return std::string("exec ") + kSampleDescription;
       }},
      {"execStream",
       [](Sandbox& s) {
         CountingSink sink;
         auto r = s.execStream(sampleRequest(), sink);
         EXPECT_TRUE(r.ok() && r->exit_code == 18);
         EXPECT_EQ(sink.out, "streamed") << "the caller's sink must reach the wrapped sandbox";
         return std::string("execStream ") + kSampleDescription;
       }},
      {"supportsStdinFd",
       [](Sandbox& s) {
         EXPECT_TRUE(s.supportsStdinFd());
         return "supportsStdinFd";
       }},
      {"spawn",
       [](Sandbox& s) {
         auto r = s.spawn(sampleRequest());
         EXPECT_TRUE(r.ok() && r->pid == 4242);
         return std::string("spawn ") + kSampleDescription;
       }},
      {"setMemoryLimit",
       [](Sandbox& s) {
         auto st = s.setMemoryLimit(64LL << 20);
         EXPECT_TRUE(!st.ok() && st.error().code() == ErrorCode::kResourceExhausted);
         return std::string("setMemoryLimit 67108864");
       }},
      {"setEgress",
       [](Sandbox& s) {
         auto policy = backends::parseEgressPolicy({"10.0.0.0/8", "pypi.org:443"});
         EXPECT_TRUE(policy.ok());
         EXPECT_EQ(s.setEgress(*policy).error().message(), "recorded egress");
         return "setEgress 10.0.0.0/8 pypi.org:443";
       }},
      {"setProtectedPaths",
       [](Sandbox& s) {
         EXPECT_EQ(s.setProtectedPaths({"/usr", "/w/tests"}).error().message(), "recorded protect");
         return "setProtectedPaths /usr /w/tests";
       }},
      {"violations",
       [](Sandbox& s) {
         auto v = s.violations();
         EXPECT_TRUE(v.ok() && v->size() == 1 && v->at(0).target == "recorded.example");
         return "violations";
       }},
      {"openForRead",
       [](Sandbox& s) {
         auto fd = s.openForRead("/r/path");
         EXPECT_TRUE(fd.ok() && fd->valid());
         return "openForRead /r/path";
       }},
      {"openForWrite",
       [](Sandbox& s) {
         auto fd = s.openForWrite("/w/path", 0640);
         EXPECT_TRUE(fd.ok() && fd->valid());
         return "openForWrite /w/path 416";
       }},
      {"stat",
       [](Sandbox& s) {
         auto st = s.stat("/s/path");
         EXPECT_TRUE(st.ok() && st->name == "stat-name" && st->size == 99);
         return "stat /s/path";
       }},
      {"listDir",
       [](Sandbox& s) {
         auto l = s.listDir("/l/path");
         EXPECT_TRUE(l.ok() && l->size() == 3);
         return "listDir /l/path";
       }},
      {"remove",
       [](Sandbox& s) {
         auto st = s.remove("/x/path", true);
         EXPECT_TRUE(!st.ok() && st.error().code() == ErrorCode::kNotFound);
         return "remove /x/path recursive";
       }},
      {"pause",
       [](Sandbox& s) {
         EXPECT_EQ(s.pause().error().message(), "recorded pause");
         return "pause";
       }},
      {"resume",
       [](Sandbox& s) {
         EXPECT_EQ(s.resume().error().message(), "recorded resume");
         return "resume";
       }},
      {"reclaimMemory",
       [](Sandbox& s) {
         EXPECT_EQ(s.reclaimMemory().error().message(), "recorded reclaim");
         return "reclaimMemory";
       }},
      {"destroy",
       [](Sandbox& s) {
         EXPECT_EQ(s.destroy().error().message(), "recorded destroy");
         return "destroy";
       }},
      {"usage",
       [](Sandbox& s) {
         auto u = s.usage();
         EXPECT_TRUE(u.ok() && u->memory_bytes == 1234 && u->oom_kills == 5);
         return "usage";
       }},
      {"snapshot",
       [](Sandbox& s) {
         auto k = s.snapshot("/x/snap");
         EXPECT_TRUE(k.ok() && *k == backends::SnapshotKind::kMachine);
         return "snapshot /x/snap";
       }},
      {"persistentState",
       [](Sandbox& s) {
         EXPECT_EQ(s.persistentState(), (nlohmann::json{{"rec", 1}}));
         return "persistentState";
       }},
  };
}

// Every wrapper type in the tree, by class name, and how to wrap a sandbox in it.
struct Wrapper {
  std::string class_name;
  std::function<std::unique_ptr<Sandbox>(std::unique_ptr<Sandbox>)> wrap;
};

std::vector<Wrapper> wrappers() {
  return {
      {"ForwardingSandbox",
       [](std::unique_ptr<Sandbox> inner) { return std::make_unique<backends::ForwardingSandbox>(std::move(inner)); }},
      {"MountedSandbox",  // launcher/src/NodeFncall.cc: fncall workers with their image mount
       [](std::unique_ptr<Sandbox> inner) { return launcher::makeMountedSandbox(nullptr, std::move(inner)); }},
  };
}

// Sandboxes of backends: they implement the operations and wrap nothing.
const std::set<std::string> kBackendSandboxes = {"ContainerSandbox", "SimulatedSandbox", "VmSandbox",
                                                 "ForwardingSandbox"};

std::string readSource(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The names of the virtual functions declared in `class Sandbox { ... };` of Sandbox.h (not the destructor).
std::set<std::string> declaredOperations() {
  const std::string header = readSource(std::string(DSEC_SOURCE_DIR) + "/backends/include/dsec/backends/Sandbox.h");
  const size_t begin = header.find("\nclass Sandbox {");
  const size_t end = header.find("\n};", begin);
  if (begin == std::string::npos || end == std::string::npos) return {};
  const std::string body = header.substr(begin, end - begin);
  std::set<std::string> names;
  const std::regex virtual_fn(R"(virtual\s+(?!~)[^;{(]*?\b(\w+)\s*\()");
  for (std::sregex_iterator it(body.begin(), body.end(), virtual_fn), last; it != last; ++it) {
    names.insert((*it)[1].str());
  }
  return names;
}

// class NAME ... : public [backends::]BASE, for BASE Sandbox or ForwardingSandbox, in every source file of
// the product (test fakes under tests/ are not wrappers of the product).
std::vector<std::pair<std::string, std::string>> derivedClassesInTree() {
  std::vector<std::pair<std::string, std::string>> found;
  const std::regex derived(
      R"(class\s+(\w+)\s*(?:final\s*)?:\s*public\s+(?:dsec::)?(?:backends::)?(Sandbox|ForwardingSandbox)\b)");
  for (const char* top : {"backends", "launcher", "cli", "common", "fs3", "placement", "spank", "bench"}) {
    const std::filesystem::path root = std::filesystem::path(DSEC_SOURCE_DIR) / top;
    if (!std::filesystem::exists(root)) continue;
    for (const auto& entry : std::filesystem::recursive_directory_iterator(root)) {
      const auto ext = entry.path().extension();
      if (!entry.is_regular_file() || (ext != ".cc" && ext != ".h" && ext != ".cpp" && ext != ".hpp")) continue;
      const std::string text = readSource(entry.path().string());
      for (std::sregex_iterator it(text.begin(), text.end(), derived), last; it != last; ++it) {
        found.emplace_back((*it)[1].str(), (*it)[2].str());
      }
    }
  }
  return found;
}

TEST(SandboxWrappersForwardTest, EveryOperationOfTheInterfaceIsChecked) {
  const auto declared = declaredOperations();
  ASSERT_FALSE(declared.empty()) << "could not read the operations of Sandbox from Sandbox.h";
  std::set<std::string> checked;
  for (const auto& op : operations()) checked.insert(op.name);
  for (const auto& name : declared) {
    EXPECT_TRUE(checked.count(name)) << "Sandbox::" << name
                                     << " is not checked through the wrappers: add it to operations() here";
  }
  for (const auto& name : checked) EXPECT_TRUE(declared.count(name)) << name << " is not an operation of Sandbox";
}

TEST(SandboxWrappersForwardTest, EveryWrapperInTheTreeIsChecked) {
  std::set<std::string> listed;
  for (const auto& w : wrappers()) listed.insert(w.class_name);
  const auto classes = derivedClassesInTree();
  ASSERT_FALSE(classes.empty()) << "found no Sandbox implementation under " << DSEC_SOURCE_DIR;
  for (const auto& [name, base] : classes) {
    if (base == "ForwardingSandbox") {
      EXPECT_TRUE(listed.count(name)) << name << " wraps a sandbox: add it to wrappers() here";
    } else {
      EXPECT_TRUE(kBackendSandboxes.count(name))
          << name << " derives from Sandbox directly: a wrapper must derive from ForwardingSandbox (and be "
          << "listed in wrappers() here); a backend's own sandbox goes into kBackendSandboxes";
    }
  }
}

TEST(SandboxWrappersForwardTest, EveryWrapperForwardsEveryOperationWithItsArguments) {
  for (const auto& wrapper : wrappers()) {
    for (const auto& op : operations()) {
      SCOPED_TRACE(wrapper.class_name + "::" + op.name);
      std::vector<std::string> log;
      auto wrapped = wrapper.wrap(std::make_unique<RecordingSandbox>(&log));
      const std::string expected = op.call(*wrapped);
      ASSERT_FALSE(log.empty()) << wrapper.class_name << " did not forward " << op.name;
      EXPECT_EQ(log.front(), expected) << wrapper.class_name << " changed the arguments of " << op.name;
      EXPECT_EQ(log.size(), 1u) << wrapper.class_name << " did more than forward " << op.name;
    }
  }
}

}  // namespace
}  // namespace dsec::testing
