// A Python image for fncall tests, built from the host's Debian python3.11 (no network, no debootstrap):
// /usr/bin/python3.11 and /usr/lib/python3.11 (without test/, idlelib, tkinter, ensurepip), the shared
// libraries ldd lists for them and their extension modules, /bin/bash, and busybox for the usual tools.
// Reused by the API and pydsec tests (link dsec_fncall_test_image, or run dsec-test-python-rootfs DIR).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dsec/backends/Sandbox.h"
#include "dsec/backends/fncall/FunctionService.h"
#include "dsec/common/Result.h"

namespace dsec::fs3 {
class LayerStore;
class LayerMounter;
class ImageMount;
}  // namespace dsec::fs3

namespace dsec::testing {

// Empty when this host can build the image; otherwise what is missing (for GTEST_SKIP).
std::string missingPythonRootfsTools();
// Writes the root file system into dir (created if missing; should be empty).
Status writePythonRootfs(const std::string& dir);

// The rootfs as layer "python:3.11-test" in a layer store under a temp dir, mounted with fs3::LayerMounter.
// Everything (mount, store, temp dir) goes with the object.
class PythonTestImage {
 public:
  static constexpr const char* kImage = "python:3.11-test";
  static Result<std::unique_ptr<PythonTestImage>> make();
  ~PythonTestImage();
  PythonTestImage(const PythonTestImage&) = delete;
  PythonTestImage& operator=(const PythonTestImage&) = delete;

  const std::vector<std::string>& lowerDirs() const;
  fs3::LayerStore& store() { return *store_; }
  fs3::LayerMounter& mounter() { return *mounter_; }
  const std::string& storeRoot() const { return base_; }

 private:
  PythonTestImage() = default;
  std::string base_;
  std::unique_ptr<fs3::LayerStore> store_;
  std::unique_ptr<fs3::LayerMounter> mounter_;
  std::unique_ptr<fs3::ImageMount> mount_;
};

// A worker factory over a container backend and the image (any image name maps to it).
backends::fncall::WorkerSandboxFactory makeTestWorkerFactory(backends::Backend* backend, PythonTestImage* image);

}  // namespace dsec::testing
