#include "dsec/launcher/api/StoreServer.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "dsec/common/Logging.h"
#include "dsec/common/Strings.h"
#include "dsec/fs3/ChunkStore.h"
#include "dsec/fs3/LayerRef.h"
#include "dsec/fs3/Prefetch.h"
#include "dsec/fs3/SharedStore.h"
#include "dsec/fs3/StoreMaintenance.h"
#include "dsec/launcher/api/Requests.h"

namespace dsec::launcher {
namespace {

constexpr uint64_t kMaxManifestBytes = 64ull << 20;
constexpr uint64_t kMaxRecordingBytes = 16ull << 20;
constexpr uint64_t kMaxLeaseBytes = 1ull << 20;

// Opens `relative` beneath the store: no "..", no absolute path, no symbolic link anywhere on the way.
Result<UniqueFd> openBeneath(int store_fd, const std::string& relative) {
  struct open_how how {};
  how.flags = O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV;
  int fd = static_cast<int>(::syscall(SYS_openat2, store_fd, relative.c_str(), &how, sizeof(how)));
  if (fd < 0) return Error::sys(errno, relative);
  return UniqueFd(fd);
}

// "/layers/NAME/VERSION/FILE" -> (NAME, VERSION, FILE), with NAME:VERSION a valid layer ref.
bool splitLayerTarget(std::string_view path, std::string* name, std::string* version, std::string* file) {
  constexpr std::string_view kPrefix = "/layers/";
  if (path.substr(0, kPrefix.size()) != kPrefix) return false;
  auto parts = split(path.substr(kPrefix.size()), '/');
  if (parts.size() != 3) return false;
  if (!fs3::validateLayerRef(fs3::LayerRef{parts[0], parts[1]}).ok()) return false;
  *name = parts[0];
  *version = parts[1];
  *file = parts[2];
  return true;
}

}  // namespace

Result<std::unique_ptr<StoreServer>> StoreServer::start(const StoreServerOptions& options) {
  if (options.latency_ms < 0 || options.latency_ms > 10000) return Error::invalid("latency must be 0-10000 ms");
  std::unique_ptr<StoreServer> server(new StoreServer(options));
  server->store_fd_ = UniqueFd(::open(options.store_dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!server->store_fd_) return Error::sys(errno, "layer store " + options.store_dir);
  DSEC_ASSIGN_OR_RETURN(server->http_, HttpServer::start(options.http, server.get()));
  DSEC_LOG(kInfo, "store") << "serving the layer store " << options.store_dir << " at " << server->endpoint()
                           << (options.latency_ms > 0 ? " (+" + std::to_string(options.latency_ms) + " ms per answer)"
                                                      : std::string())
                           << (options.accept_recordings ? ", taking prefetch recordings" : "")
                           << (options.accept_leases ? ", taking leases" : "");
  return server;
}

StoreServer::~StoreServer() { stop(); }

void StoreServer::stop() {
  if (http_) http_->stop();
}

void StoreServer::refuse(HttpExchange& exchange, int status, const std::string& code, const std::string& message) {
  ++stats_.refused;
  exchange.sendError(status, code, message);
}

void StoreServer::handle(HttpExchange& exchange) {
  ++stats_.requests;
  if (exchange.hasBody() && exchange.method() != http::verb::put) {  // PUT handlers read (or refuse) their body
    if (!exchange.discardBody(1 << 20)) exchange.forceClose();
  }
  if (!options_.token.empty()) {
    auto auth = exchange.head()[http::field::authorization];
    if (!bearerTokenMatches(std::string_view(auth.data(), auth.size()), options_.token)) {
      if (exchange.hasBody()) exchange.forceClose();
      return refuse(exchange, 401, "unauthenticated", "this layer store needs its token (DSEC_STORE_TOKEN)");
    }
    exchange.markAuthenticated();
  }
  if (options_.latency_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(options_.latency_ms));
  std::string_view target = exchange.target();
  if (target.find('?') != std::string_view::npos) target = target.substr(0, target.find('?'));
  const bool get = exchange.method() == http::verb::get || exchange.method() == http::verb::head;

  constexpr std::string_view kChunks = "/chunks/";
  if (target.substr(0, kChunks.size()) == kChunks) {
    auto parts = split(target.substr(kChunks.size()), '/');
    if (parts.size() != 2 || !fs3::isSha256Hex(parts[1]) || parts[0] != parts[1].substr(0, 2)) {
      return refuse(exchange, 404, "not_found", "no such chunk");
    }
    if (!get) return refuse(exchange, 405, "method_not_allowed", "chunks are read-only here");
    return sendStoreFile(exchange, "chunks/" + parts[0] + "/" + parts[1], fs3::kMaxChunkSize, true);
  }
  std::string name, version, file;
  if (splitLayerTarget(target, &name, &version, &file) && (file == "manifest.json" || file == "prefetch.json")) {
    if (exchange.method() == http::verb::put && file == "prefetch.json") return putRecording(exchange, name, version);
    if (!get) return refuse(exchange, 405, "method_not_allowed", "GET only");
    return sendStoreFile(exchange, "layers/" + name + "/" + version + "/" + file, kMaxManifestBytes, false);
  }
  constexpr std::string_view kLeases = "/leases/";
  if (target.substr(0, kLeases.size()) == kLeases) return lease(exchange, std::string(target.substr(kLeases.size())));
  refuse(exchange, 404, "not_found", "not a path of the layer store");
}

void StoreServer::lease(HttpExchange& exchange, const std::string& name) {
  if (!options_.accept_leases) {
    exchange.forceClose();
    return refuse(exchange, 403, "forbidden", "this layer store takes no leases (serve --accept-leases)");
  }
  fs3::ChunkStore store(options_.store_dir);
  if (exchange.method() == http::verb::delete_) {
    if (Status st = fs3::removeLeaseAs(store, name); !st.ok()) {
      return refuse(exchange, 400, "invalid_argument", st.error().message());
    }
    return exchange.sendJson(200, nlohmann::json{{"removed", name}});
  }
  if (exchange.method() != http::verb::put) return refuse(exchange, 405, "method_not_allowed", "PUT or DELETE");
  bool too_large = false;
  auto body = exchange.readBody(kMaxLeaseBytes, &too_large);
  if (!body.ok()) {
    exchange.forceClose();
    return refuse(exchange, too_large ? 413 : 400, "invalid_argument", "lease: " + body.error().message());
  }
  auto j = nlohmann::json::parse(*body, nullptr, false);
  std::set<fs3::LayerRef> layers;
  std::string host;
  bool ok =
      j.is_object() && j.contains("host") && j["host"].is_string() && j.contains("layers") && j["layers"].is_array();
  if (ok) {
    host = j["host"].get<std::string>();
    ok = !host.empty() && host.size() <= 255;
    for (const auto& l : j["layers"]) {
      auto ref = l.is_string() ? fs3::parseLayerRef(l.get<std::string>()) : Error::invalid("not a string");
      if (!ref.ok()) {
        ok = false;
        break;
      }
      layers.insert(*ref);
    }
  }
  if (!ok)
    return refuse(exchange, 400, "invalid_argument", "a lease is {\"host\": NAME, \"layers\": [\"name:version\"]}");
  if (Status st = fs3::writeLeaseAs(store, name, host, layers); !st.ok()) {
    if (st.error().code() == ErrorCode::kInvalidArgument) {
      return refuse(exchange, 400, "invalid_argument", st.error().message());
    }
    return exchange.sendError(500, "internal", st.error().message());
  }
  exchange.sendJson(200, nlohmann::json{{"lease", name}});
}

void StoreServer::sendStoreFile(HttpExchange& exchange, const std::string& relative, uint64_t max_bytes,
                                bool is_chunk) {
  auto fd = openBeneath(store_fd_.get(), relative);
  struct stat st {};
  if (!fd.ok() || ::fstat(fd->get(), &st) != 0 || !S_ISREG(st.st_mode) ||
      static_cast<uint64_t>(st.st_size) > max_bytes) {
    if (!fd.ok() && fd.error().sysErrno() != ENOENT) {
      DSEC_LOG(kWarn, "store") << "refused " << relative << ": " << fd.error().message();
    }
    return refuse(exchange, 404, "not_found", "not in the layer store");
  }
  std::string bytes(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < bytes.size()) {
    ssize_t n = ::pread(fd->get(), bytes.data() + got, bytes.size() - got, static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  if (got != bytes.size()) {
    return exchange.sendError(500, "internal", "reading " + relative + " failed");
  }
  if (is_chunk) ++stats_.chunks_served;
  stats_.bytes_served += bytes.size();
  exchange.sendText(200, is_chunk ? "application/octet-stream" : "application/json", std::move(bytes));
}

void StoreServer::putRecording(HttpExchange& exchange, const std::string& name, const std::string& version) {
  if (!options_.accept_recordings) {
    exchange.forceClose();
    return refuse(exchange, 403, "forbidden", "this layer store takes no recordings (serve --accept-recordings)");
  }
  bool too_large = false;
  auto body = exchange.readBody(kMaxRecordingBytes, &too_large);
  if (!body.ok()) {
    exchange.forceClose();
    return refuse(exchange, too_large ? 413 : 400, "invalid_argument", "recording: " + body.error().message());
  }
  fs3::DirectoryStore store(options_.store_dir);
  const fs3::LayerRef ref{name, version};
  auto layer = store.manifest(ref);
  if (!layer.ok()) return refuse(exchange, 404, "not_found", layer.error().message());
  // Only a recording of this layer's bytes is kept: a node cannot make others prefetch what the layer lacks.
  if (auto chunks = fs3::parseRecording(*body, *layer); !chunks.ok()) {
    return refuse(exchange, 400, "invalid_argument",
                  "recording of " + ref.toString() + ": " + chunks.error().message());
  }
  if (Status st = store.putRecording(ref, *body); !st.ok()) {
    return exchange.sendError(500, "internal", st.error().message());
  }
  exchange.sendJson(200, nlohmann::json{{"stored", ref.toString()}});
}

}  // namespace dsec::launcher
