#include "dsec/launcher/node/NodeFncall.h"

#include "dsec/backends/ForwardingSandbox.h"
#include "dsec/backends/fncall/FunctionService.h"
#include "dsec/common/Logging.h"
#include "dsec/fs3/LayerRef.h"

namespace dsec::launcher {
namespace {

constexpr const char* kLog = "fncall";
using backends::ExecResult;
using backends::Sandbox;
using backends::SandboxSpec;

// A worker sandbox that keeps its image's layers mounted for as long as it lives. Every operation is
// ForwardingSandbox's: this class adds only the order of teardown.
class MountedSandbox : public backends::ForwardingSandbox {
 public:
  MountedSandbox(std::unique_ptr<fs3::ImageMount> mount, std::unique_ptr<Sandbox> sandbox)
      : ForwardingSandbox(std::move(sandbox)), mount_(std::move(mount)) {}
  ~MountedSandbox() override {
    // The layers may only go once nothing runs on them.
    if (auto st = ForwardingSandbox::destroy(); !st.ok()) {
      DSEC_LOG(kWarn, kLog) << "destroying worker " << spec().id << ": " << st.error().toString();
    }
    releaseInner();
    mount_.reset();
  }

 private:
  std::unique_ptr<fs3::ImageMount> mount_;
};

Error missingImage(const std::string& image, const std::string& node, const Error& why) {
  return Error::notFound("fncall image '" + image + "' is not available on node " + node + ": " + why.message() +
                         ". examples/rollout.py builds debian:12+python:3.11 (the default); any image with "
                         "python3 (and bash for language \"bash\") works: name it with \"image\" or start the "
                         "node with --fncall-image");
}

}  // namespace

std::unique_ptr<Sandbox> makeMountedSandbox(std::unique_ptr<fs3::ImageMount> mount, std::unique_ptr<Sandbox> sandbox) {
  return std::make_unique<MountedSandbox>(std::move(mount), std::move(sandbox));
}

Result<std::unique_ptr<NodeFncall>> NodeFncall::start(const FncallOptions& options, const std::string& node_name,
                                                      ImageSource* images, backends::Backend* backend) {
  if (options.max_workers <= 0) return Error(ErrorCode::kUnsupported, "fncall is disabled on this node");
  auto default_layers = fs3::parseImageRef(options.image);
  if (!default_layers.ok()) return default_layers.error().wrap("fncall image '" + options.image + "'");
  std::unique_ptr<NodeFncall> node(new NodeFncall(options, node_name, images));
  node->options_.image = fs3::imageToString(*default_layers);

  backends::fncall::FunctionServiceOptions service_options;
  service_options.default_image = node->options_.image;
  service_options.node_name = node_name;
  service_options.max_workers = options.max_workers;
  service_options.queue_wait_seconds = options.queue_wait_seconds;
  auto factory = [images, backend](const std::string& image,
                                   const SandboxSpec& spec) -> Result<std::unique_ptr<Sandbox>> {
    DSEC_ASSIGN_OR_RETURN(auto layers, fs3::parseImageRef(image));
    DSEC_TRY(images->check(layers));
    auto mount = images->acquire(layers);
    if (!mount.ok()) return mount.error().wrap("mounting fncall image " + image);
    SandboxSpec full = spec;
    full.image = fs3::imageToString(layers);
    full.lower_dirs = (*mount)->dirs();
    auto sandbox = backend->create(full);
    if (!sandbox.ok()) return sandbox.error().wrap("creating fncall worker " + spec.id);
    return makeMountedSandbox(std::move(*mount), std::move(*sandbox));
  };
  auto service = backends::fncall::FunctionService::start(service_options, factory);
  if (!service.ok()) return service.error().wrap("starting the fncall service");
  node->service_ = std::move(*service);
  return node;
}

NodeFncall::NodeFncall(const FncallOptions& options, std::string node_name, ImageSource* images)
    : options_(options), node_name_(std::move(node_name)), images_(images) {}

NodeFncall::~NodeFncall() { shutdown(); }

Result<ExecResult> NodeFncall::call(backends::fncall::CallRequest request) {
  if (request.image.empty()) request.image = options_.image;
  // Checked here so a missing image is a clear 404 at once rather than a failed worker start.
  auto layers = fs3::parseImageRef(request.image);
  if (!layers.ok()) return layers.error();
  if (auto st = images_->check(*layers); !st.ok()) {
    if (st.error().code() == ErrorCode::kNotFound) return missingImage(request.image, node_name_, st.error());
    return st.error();
  }
  return service_->call(request);
}

backends::fncall::FncallStats NodeFncall::stats() { return service_->stats(); }

void NodeFncall::renderMetrics(std::string* out) { service_->renderMetrics(out); }

void NodeFncall::shutdown() {
  if (service_) service_->shutdown();
}

}  // namespace dsec::launcher
