// `dsec layer serve`: the shared layer store over HTTP (docs/layer-store.md), for a cluster whose nodes share no
// file system, and for measuring on-demand starts over a real network link (`dsec bench image-start`). Read-only
// GETs of what a node reads from a directory store:
//
//   GET /chunks/<sha[0:2]>/<sha256>               a chunk's bytes
//   GET /layers/<NAME>/<VERSION>/manifest.json    a layer's manifest
//   GET /layers/<NAME>/<VERSION>/prefetch.json    its prefetch recording (404: none yet)
//   PUT /layers/<NAME>/<VERSION>/prefetch.json    a node's recording, only with accept_recordings, and only one
//                                                 that checks out against the layer's manifest
//   PUT|DELETE /leases/<host>.<pid>               a node's lease naming the layers it uses (StoreMaintenance.h),
//                                                 only with accept_leases: what lets `dsec layer gc` on the store's
//                                                 directory see nodes that reach it over HTTP
//
// Names are checked before any path is built, and files are opened beneath the store with no symbolic link
// followed, so a request reaches nothing but the store's own chunks, manifests and recordings. Nodes check
// everything they get (chunks against their hash, manifests against their checksum), so the server is trusted
// for availability only.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "dsec/common/Fd.h"
#include "dsec/common/Result.h"
#include "dsec/launcher/api/HttpServer.h"

namespace dsec::launcher {

struct StoreServerOptions {
  std::string store_dir;
  HttpServerOptions http;  // listen ADDR:PORT
  // Added before every answer: the round trip of a cluster file system, when the server stands in for one.
  int latency_ms = 0;
  bool accept_recordings = false;
  bool accept_leases = false;
  // When set, every request must carry "Authorization: Bearer <token>" (nodes: DSEC_STORE_TOKEN).
  std::string token;
};

struct StoreServerStats {
  std::atomic<uint64_t> requests{0};
  std::atomic<uint64_t> chunks_served{0};
  std::atomic<uint64_t> bytes_served{0};
  std::atomic<uint64_t> refused{0};  // 4xx answers
};

class StoreServer : public RequestHandler {
 public:
  static Result<std::unique_ptr<StoreServer>> start(const StoreServerOptions& options);
  ~StoreServer() override;

  std::string endpoint() const { return http_->endpoint(); }  // "http://ADDR:PORT"
  const StoreServerStats& stats() const { return stats_; }
  void stop();
  void handle(HttpExchange& exchange) override;

 private:
  explicit StoreServer(StoreServerOptions options) : options_(std::move(options)) {}
  void refuse(HttpExchange& exchange, int status, const std::string& code, const std::string& message);
  // Sends the regular file at `relative` beneath the store (at most max_bytes), or 404.
  void sendStoreFile(HttpExchange& exchange, const std::string& relative, uint64_t max_bytes, bool is_chunk);
  void putRecording(HttpExchange& exchange, const std::string& name, const std::string& version);
  void lease(HttpExchange& exchange, const std::string& name);

  StoreServerOptions options_;
  UniqueFd store_fd_;  // O_PATH of the store's directory
  StoreServerStats stats_;
  std::unique_ptr<HttpServer> http_;
};

}  // namespace dsec::launcher
