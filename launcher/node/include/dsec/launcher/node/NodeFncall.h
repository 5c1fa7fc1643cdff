// The node's fncall backend (docs/api.md, "Function calls"): a FunctionService whose worker sandboxes are
// container sandboxes on the node's own image source. Workers are the node's, not a user's: they
// are never listed, never persisted (a restarted agent reaps their cgroups as leftovers) and always destroyed
// when the node shuts down, even when user sandboxes are left for re-adoption.
#pragma once

#include <memory>
#include <string>

#include "dsec/backends/Sandbox.h"
#include "dsec/common/Result.h"
#include "dsec/fs3/LayerMounter.h"
#include "dsec/launcher/node/ImageSource.h"

namespace dsec::backends::fncall {
struct CallRequest;
struct FncallStats;
class FunctionService;
}  // namespace dsec::backends::fncall

namespace dsec::launcher {

constexpr const char* kDefaultFncallImage = "debian:12+python:3.11";  // what examples/rollout.py builds

struct FncallOptions {
  std::string image = kDefaultFncallImage;  // used when a call names none
  int max_workers = 8;                      // warm workers over all pools; 0 disables fncall on the node
  double queue_wait_seconds = 2;            // a call waits this long for a worker, then 429 capacity
};

// Wraps a worker's container sandbox together with the mount of its image's layers, so the layers stay
// mounted exactly as long as the sandbox lives; the sandbox is destroyed before the mount is released.
std::unique_ptr<backends::Sandbox> makeMountedSandbox(std::unique_ptr<fs3::ImageMount> mount,
                                                      std::unique_ptr<backends::Sandbox> sandbox);

class NodeFncall {
 public:
  // images and backend must outlive the result (the node agent owns all three).
  static Result<std::unique_ptr<NodeFncall>> start(const FncallOptions& options, const std::string& node_name,
                                                   ImageSource* images, backends::Backend* backend);
  ~NodeFncall();
  NodeFncall(const NodeFncall&) = delete;
  NodeFncall& operator=(const NodeFncall&) = delete;

  // Runs one call. A call without an image gets the default one; an image missing from the store is
  // kNotFound naming it and how to build it; no worker in time is kResourceExhausted.
  Result<backends::ExecResult> call(backends::fncall::CallRequest request);
  // The function service's own report of its pools and calls (FunctionService::stats).
  backends::fncall::FncallStats stats();
  void renderMetrics(std::string* out);
  // Destroys every worker sandbox. Idempotent.
  void shutdown();
  const std::string& defaultImage() const { return options_.image; }

 private:
  NodeFncall(const FncallOptions& options, std::string node_name, ImageSource* images);

  FncallOptions options_;
  std::string node_name_;
  ImageSource* images_;
  std::unique_ptr<backends::fncall::FunctionService> service_;
};

}  // namespace dsec::launcher
