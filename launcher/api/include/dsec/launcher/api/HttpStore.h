// A node's shared layer store reached over HTTP (`--store http://HOST:PORT`): what `dsec layer serve` serves
// (StoreServer.h). Chunks, manifests and recordings come over keep-alive connections; a server that is briefly
// away (refused, timed out, 5xx, a chunk it lacks for a moment) is retried with backoff for retry_seconds, then the
// read fails with EIO, as a directory store that vanishes does. has() remembers the layers a manifest was read for
// (it runs before creates); manifest() reads it again each time (once per mount), so a layer removed and pushed
// anew is mounted with its new manifest. Leases go to the server (kept when it runs with --accept-leases), so that
// `dsec layer gc` on the store's directory sees the layers these nodes use (docs/layer-store.md).
#pragma once

#include <mutex>
#include <set>
#include <string>

#include "dsec/fs3/SharedStore.h"
#include "dsec/launcher/api/ConnectionPool.h"

namespace dsec::launcher {

class HttpStore : public fs3::SharedStore {
 public:
  // url: "http://HOST:PORT" (checked); token: sent as a bearer token when not empty.
  static Result<std::shared_ptr<HttpStore>> open(const std::string& url, std::string token, double retry_seconds = 10);

  Result<std::string> fetch(const std::string& sha256, int64_t length) override;
  std::string location() const override { return url_; }
  Result<fs3::StoredLayer> manifest(const fs3::LayerRef& ref) override;
  bool has(const fs3::LayerRef& ref) override;
  Result<std::string> recording(const fs3::LayerRef& ref) override;
  Status putRecording(const fs3::LayerRef& ref, const std::string& text) override;
  Status renewLease(const std::set<fs3::LayerRef>& in_use) override;
  void dropLease() override;

 private:
  HttpStore(std::string url, std::string endpoint, std::string token, double retry_seconds)
      : url_(std::move(url)), endpoint_(std::move(endpoint)), token_(std::move(token)), retry_seconds_(retry_seconds) {}
  // GET target: the body of a 200, kNotFound for a 404 (after retrying one for `not_found_retry`), else what went
  // wrong once the retries are spent.
  Result<std::string> get(const std::string& target, uint64_t max_bytes, double retry_seconds, bool retry_not_found);

  std::string url_;
  std::string endpoint_;
  std::string token_;
  double retry_seconds_;
  client::ConnectionPool pool_;
  std::mutex mu_;
  std::set<fs3::LayerRef> named_;  // layers whose manifest was read and checked
};

// The store a `--store` value names: a chunk server for "http://...", else a directory (checked to be one).
Result<std::shared_ptr<fs3::SharedStore>> openSharedStore(const std::string& location, double retry_seconds = 10);

}  // namespace dsec::launcher
