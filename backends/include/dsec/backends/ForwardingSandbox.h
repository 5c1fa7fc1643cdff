// A Sandbox that hands every operation to another sandbox it owns. Wrappers derive from it and override
// only what they add (the launcher's MountedSandbox keeps an image mounted for as long as its sandbox
// lives), so no wrapper can lose an operation: every operation of Sandbox is pure virtual and forwarded
// here, in one place. tests/security/SandboxWrappersForwardTest.cc calls each operation through every
// wrapper in the tree and checks that it reached the wrapped sandbox with its arguments.
#pragma once

#include <memory>
#include <utility>

#include "dsec/backends/Sandbox.h"

namespace dsec::backends {

class ForwardingSandbox : public Sandbox {
 public:
  explicit ForwardingSandbox(std::unique_ptr<Sandbox> inner) : inner_(std::move(inner)) {}

  const SandboxSpec& spec() const override { return inner_->spec(); }
  SandboxState state() const override { return inner_->state(); }
  std::string backendName() const override { return inner_->backendName(); }

  Result<ExecResult> exec(const ExecRequest& request) override { return inner_->exec(request); }
  Result<ExecResult> execStream(const ExecRequest& request, ExecSink& sink) override {
    return inner_->execStream(request, sink);
  }
  bool supportsStdinFd() const override { return inner_->supportsStdinFd(); }
  Result<LongRunningProcess> spawn(const ExecRequest& request) override { return inner_->spawn(request); }
  Status setMemoryLimit(int64_t bytes) override { return inner_->setMemoryLimit(bytes); }
  Status setEgress(const EgressPolicy& policy) override { return inner_->setEgress(policy); }
  Status setProtectedPaths(const std::vector<std::string>& paths) override { return inner_->setProtectedPaths(paths); }
  Result<std::vector<Violation>> violations() override { return inner_->violations(); }

  Result<UniqueFd> openForRead(const std::string& path) override { return inner_->openForRead(path); }
  Result<UniqueFd> openForWrite(const std::string& path, uint32_t mode) override {
    return inner_->openForWrite(path, mode);
  }
  Result<FileStat> stat(const std::string& path) override { return inner_->stat(path); }
  Result<std::vector<FileStat>> listDir(const std::string& path) override { return inner_->listDir(path); }
  Status remove(const std::string& path, bool recursive) override { return inner_->remove(path, recursive); }

  Status pause() override { return inner_->pause(); }
  Status resume() override { return inner_->resume(); }
  Status reclaimMemory() override { return inner_->reclaimMemory(); }
  Status destroy() override { return inner_->destroy(); }
  Result<SandboxUsage> usage() override { return inner_->usage(); }
  Result<SnapshotKind> snapshot(const std::string& dir) override { return inner_->snapshot(dir); }

  nlohmann::json persistentState() const override { return inner_->persistentState(); }

 protected:
  // For a wrapper's destructor that must drop the wrapped sandbox before its own resources (members of a
  // derived class are destroyed before this base). No operation may be called afterwards.
  void releaseInner() { inner_.reset(); }

 private:
  std::unique_ptr<Sandbox> inner_;
};

}  // namespace dsec::backends
