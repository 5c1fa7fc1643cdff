// What `dsec bench image-start` stands on: its image (built with the dsec CLI when missing), a shared store holding
// it, and a network link to a chunk server in another network namespace, shaped like a cluster file system's
// (bandwidth by a tbf qdisc on each end of a veth pair, latency added per request by the server).
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "dsec/common/Fd.h"
#include "dsec/common/Result.h"
#include "dsec/fs3/LayerRef.h"

namespace dsec::cli {

// The bench's default image: Debian 12 + Python (the example rollout's layers) + a workspace holding a large C/C++
// source tree and a virtualenv's packages (copies of this host's /usr/include and /usr/lib/python3: some 25,000
// files, 350 MB).
inline constexpr const char* kImageStartDefaultImage = "debian:12+python:3.11+ws-cxx:1";

// Builds the missing layers of the default image in root by running this dsec binary (`dsec layer build`); for
// another image, every layer must be in root already.
Status ensureBenchImage(const std::string& root, const std::vector<fs3::LayerRef>& image);

// A network namespace with a veth pair to it, both ends shaped to `rate` (tc's syntax: "1gbit"). Removed (with the
// veth) on destruction.
class StoreLink {
 public:
  static Result<std::unique_ptr<StoreLink>> create(const std::string& rate);
  ~StoreLink();
  StoreLink(const StoreLink&) = delete;
  StoreLink& operator=(const StoreLink&) = delete;
  const std::string& netns() const { return netns_; }
  const std::string& storeAddress() const { return store_address_; }

 private:
  StoreLink() = default;
  std::string netns_;
  std::string store_address_;
};

// `dsec layer serve` run by this binary inside the link's namespace, its log in log_path; stopped (SIGTERM) on
// destruction.
class StoreServerProcess {
 public:
  static Result<std::unique_ptr<StoreServerProcess>> start(const StoreLink& link, const std::string& store_dir,
                                                           int latency_ms, const std::string& log_path);
  ~StoreServerProcess();
  StoreServerProcess(const StoreServerProcess&) = delete;
  StoreServerProcess& operator=(const StoreServerProcess&) = delete;
  const std::string& url() const { return url_; }

 private:
  StoreServerProcess() = default;
  pid_t pid_ = -1;
  UniqueFd output_;  // its stdout
  std::string url_;
};

}  // namespace dsec::cli
