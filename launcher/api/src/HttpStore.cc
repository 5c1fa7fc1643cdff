#include "dsec/launcher/api/HttpStore.h"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "dsec/common/Endpoint.h"
#include "dsec/common/Strings.h"
#include "dsec/fs3/StoreMaintenance.h"
#include "dsec/launcher/api/HttpClient.h"

namespace dsec::launcher {
namespace {

constexpr uint64_t kMaxManifestBytes = 64ull << 20;
constexpr uint64_t kMaxRecordingBytes = 16ull << 20;
constexpr double kManifestRetrySeconds = 2;  // a create waits this long at most for a store that is away

std::string layerTarget(const fs3::LayerRef& ref, const std::string& file) {
  return "/layers/" + ref.name + "/" + ref.version + "/" + file;
}

}  // namespace

Result<std::shared_ptr<HttpStore>> HttpStore::open(const std::string& url, std::string token, double retry_seconds) {
  DSEC_ASSIGN_OR_RETURN(Endpoint endpoint, parseEndpoint(url));
  std::string clean = "http://" + endpoint.hostPort();
  return std::shared_ptr<HttpStore>(new HttpStore(clean, clean, std::move(token), retry_seconds));
}

Result<std::string> HttpStore::get(const std::string& target, uint64_t max_bytes, double retry_seconds,
                                   bool retry_not_found) {
  client::CallOptions options;
  options.pool = &pool_;
  options.max_body_bytes = max_bytes;
  options.io_timeout_ms = 10000;
  const double deadline = monotonicSeconds() + retry_seconds;
  double backoff = 0.05;
  for (;;) {
    auto reply = client::call(endpoint_, http::verb::get, target, token_, "", options);
    std::string what;
    if (!reply.ok()) {
      what = reply.error().message();
    } else if (reply->status == 200) {
      return std::move(reply->body);
    } else if (reply->status == 404 && !retry_not_found) {
      return Error::notFound(url_ + target + ": not in the store");
    } else if (reply->status == 401 || reply->status == 403) {
      return Error(ErrorCode::kUnauthenticated, url_ + target + ": refused (" + std::to_string(reply->status) +
                                                    "; is DSEC_STORE_TOKEN the store's token?)");
    } else {
      what = "HTTP " + std::to_string(reply->status);
    }
    if (monotonicSeconds() + backoff > deadline) {
      if (reply.ok() && reply->status == 404) return Error::notFound(url_ + target + ": not in the store");
      return Error(ErrorCode::kUnavailable, url_ + target + ": " + what, EIO);
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(backoff));
    backoff = std::min(backoff * 2, 1.0);
  }
}

Result<std::string> HttpStore::fetch(const std::string& sha256, int64_t length) {
  if (!fs3::isSha256Hex(sha256)) return Error(ErrorCode::kSystem, "not a chunk name", EIO);
  // One byte more than the manifest says: a longer chunk is caught by the cache's length check, not cut.
  auto bytes =
      get("/chunks/" + sha256.substr(0, 2) + "/" + sha256, static_cast<uint64_t>(length) + 1, retry_seconds_, true);
  if (!bytes.ok()) {
    return Error(ErrorCode::kSystem, "chunk " + sha256.substr(0, 12) + " from " + bytes.error().message(), EIO);
  }
  return bytes;
}

bool HttpStore::has(const fs3::LayerRef& ref) {
  {
    std::lock_guard lock(mu_);
    if (named_.count(ref) != 0) return true;
  }
  return manifest(ref).ok();
}

Result<fs3::StoredLayer> HttpStore::manifest(const fs3::LayerRef& ref) {
  DSEC_TRY(fs3::validateLayerRef(ref));
  const std::string target = layerTarget(ref, "manifest.json");
  auto text = get(target, kMaxManifestBytes, kManifestRetrySeconds, false);
  if (!text.ok()) {
    if (text.error().code() == ErrorCode::kNotFound) {
      return Error::notFound("layer " + ref.toString() + " not in the shared store " + url_);
    }
    return text.error();
  }
  DSEC_ASSIGN_OR_RETURN(fs3::StoredLayer layer, fs3::parseStoredLayer(*text, url_ + target));
  if (!(layer.layer.ref == ref)) {
    return Error(ErrorCode::kSystem, url_ + target + " is the manifest of " + layer.layer.ref.toString(), EIO);
  }
  std::lock_guard lock(mu_);
  named_.insert(ref);
  return layer;
}

Result<std::string> HttpStore::recording(const fs3::LayerRef& ref) {
  DSEC_TRY(fs3::validateLayerRef(ref));
  return get(layerTarget(ref, "prefetch.json"), kMaxRecordingBytes, kManifestRetrySeconds, false);
}

Status HttpStore::putRecording(const fs3::LayerRef& ref, const std::string& text) {
  DSEC_TRY(fs3::validateLayerRef(ref));
  client::CallOptions options;
  options.pool = &pool_;
  options.headers.emplace_back("Content-Type", "application/json");
  const std::string target = layerTarget(ref, "prefetch.json");
  DSEC_ASSIGN_OR_RETURN(auto reply, client::call(endpoint_, http::verb::put, target, token_, text, options));
  if (reply.status == 200) return okStatus();
  std::string message = reply.json().is_object() ? reply.json().value("message", "") : "";
  return Error(ErrorCode::kUnavailable, url_ + target + ": HTTP " + std::to_string(reply.status) +
                                            (message.empty() ? "" : " (" + message + ")"));
}

Status HttpStore::renewLease(const std::set<fs3::LayerRef>& in_use) {
  nlohmann::json names = nlohmann::json::array();
  for (const auto& l : in_use) names.push_back(l.toString());
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "unknown");
  client::CallOptions options;
  options.pool = &pool_;
  options.headers.emplace_back("Content-Type", "application/json");
  const std::string target = "/leases/" + fs3::ownLeaseName();
  DSEC_ASSIGN_OR_RETURN(auto reply, client::call(endpoint_, http::verb::put, target, token_,
                                                 nlohmann::json{{"host", host}, {"layers", names}}.dump(), options));
  if (reply.status == 200) return okStatus();
  if (reply.status == 403) {
    return Error(ErrorCode::kUnsupported, "the chunk server " + url_ + " takes no leases (serve --accept-leases)");
  }
  return Error(ErrorCode::kUnavailable, url_ + target + ": HTTP " + std::to_string(reply.status));
}

void HttpStore::dropLease() {
  client::CallOptions options;
  options.pool = &pool_;
  options.io_timeout_ms = 2000;
  (void)client::call(endpoint_, http::verb::delete_, "/leases/" + fs3::ownLeaseName(), token_, "", options);
}

Result<std::shared_ptr<fs3::SharedStore>> openSharedStore(const std::string& location, double retry_seconds) {
  if (fs3::isHttpStore(location)) {
    const char* token = std::getenv("DSEC_STORE_TOKEN");
    DSEC_ASSIGN_OR_RETURN(auto store, HttpStore::open(location, token != nullptr ? token : "", retry_seconds));
    return std::shared_ptr<fs3::SharedStore>(std::move(store));
  }
  auto dir = std::make_shared<fs3::DirectoryStore>(location, retry_seconds);
  struct stat st {};
  if (::stat(dir->location().c_str(), &st) != 0) return Error::sys(errno, "layer store " + dir->location());
  if (!S_ISDIR(st.st_mode)) return Error::invalid("layer store " + dir->location() + " is not a directory");
  return std::shared_ptr<fs3::SharedStore>(std::move(dir));
}

}  // namespace dsec::launcher
