#include "dsec/fs3/ChunkStore.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <memory>
#include <set>

#include "Manifest.h"
#include "dsec/common/Directory.h"
#include "dsec/common/Fd.h"
#include "dsec/common/FdIo.h"
#include "dsec/common/Strings.h"

namespace dsec::fs3 {
namespace {

constexpr int kFormat = 1;
constexpr int64_t kMaxManifestBytes = 64ll << 20;

Error corrupt(const std::string& what, const std::string& why) {
  return Error(ErrorCode::kSystem, what + " is corrupt: " + why, EIO);
}

std::string absolute(std::string dir) {
  if (!dir.empty() && dir[0] != '/') {
    char cwd[PATH_MAX];
    if (::getcwd(cwd, sizeof cwd) != nullptr) dir = std::string(cwd) + "/" + dir;
  }
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
}

// Reads up to n bytes at offset (short only at the end of the file).
Result<std::string> readAt(int fd, int64_t offset, int64_t n, const std::string& what) {
  std::string buf(static_cast<size_t>(n), '\0');
  size_t got = 0;
  while (got < buf.size()) {
    ssize_t r = ::pread(fd, buf.data() + got, buf.size() - got, static_cast<off_t>(offset) + static_cast<off_t>(got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Error::sys(errno, "read " + what);
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  buf.resize(got);
  return buf;
}

// Writes bytes to path atomically (aside, fsync, rename); a file already there is left alone (chunks are named by
// their content, so it holds the same bytes, or ChunkCache will find it does not).
Status writeOnce(const std::string& path, std::string_view bytes) {
  std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + randomHex(6);
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (!fd) return Error::sys(errno, "create " + tmp);
  Status st = writeAll(fd.get(), bytes, tmp);
  if (st.ok() && ::fsync(fd.get()) != 0) st = Error::sys(errno, "fsync " + tmp);
  fd.reset();
  if (st.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) st = Error::sys(errno, "rename " + tmp);
  if (!st.ok()) ::unlink(tmp.c_str());
  return st;
}

}  // namespace

bool isSha256Hex(std::string_view s) {
  return s.size() == 64 &&
         std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

std::string sha256Hex(std::string_view bytes) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(bytes.data(), bytes.size(), md, &len, EVP_sha256(), nullptr);
  return hexEncode(std::string_view(reinterpret_cast<const char*>(md), len));
}

int64_t StoredLayer::chunkLength(size_t index) const {
  int64_t start = static_cast<int64_t>(index) * chunk_size;
  return std::max<int64_t>(0, std::min(chunk_size, layer.size - start));
}

nlohmann::json StoredLayer::toJson() const {
  nlohmann::json j = layer.toJson();
  j["format"] = kFormat;
  j["chunk_size"] = chunk_size;
  j["chunks"] = chunks;
  j["checksum"] = sha256Hex(j.dump());  // keys sorted: the dump is canonical
  return j;
}

Result<StoredLayer> parseStoredLayer(const std::string& text, const std::string& what) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return corrupt(what, "not a JSON object");
  StoredLayer s;
  try {
    if (j.at("format").get<int>() != kFormat) return corrupt(what, "unknown format " + j.at("format").dump());
    std::string checksum = j.at("checksum").get<std::string>();
    nlohmann::json rest = j;
    rest.erase("checksum");
    if (sha256Hex(rest.dump()) != checksum) return corrupt(what, "its checksum does not match its contents");
    auto layer = manifestFromJson(text, what);
    if (!layer.ok()) return corrupt(what, layer.error().message());
    s.layer = std::move(layer).value();
    s.chunk_size = j.at("chunk_size").get<int64_t>();
    s.chunks = j.at("chunks").get<std::vector<std::string>>();
  } catch (const nlohmann::json::exception& e) {
    return corrupt(what, e.what());
  }
  if (auto st = validateLayerRef(s.layer.ref); !st.ok()) return corrupt(what, st.error().message());
  if (s.chunk_size < kMinChunkSize || s.chunk_size > kMaxChunkSize) return corrupt(what, "impossible chunk size");
  if (s.layer.size < 0 || !isSha256Hex(s.layer.sha256)) return corrupt(what, "impossible size or sha256");
  const int64_t want = (s.layer.size + s.chunk_size - 1) / s.chunk_size;
  if (static_cast<int64_t>(s.chunks.size()) != want) {
    return corrupt(what, std::to_string(s.chunks.size()) + " chunks for " + std::to_string(s.layer.size) + " bytes");
  }
  for (const auto& c : s.chunks) {
    if (!isSha256Hex(c)) return corrupt(what, "a chunk name that is not a sha256");
  }
  return s;
}

ChunkStore::ChunkStore(std::string dir) : dir_(absolute(std::move(dir))) {}

std::string ChunkStore::chunkPath(const std::string& sha256) const {
  return dir_ + "/chunks/" + sha256.substr(0, 2) + "/" + sha256;
}

std::string ChunkStore::manifestPath(const LayerRef& ref) const {
  return dir_ + "/layers/" + ref.name + "/" + ref.version + "/manifest.json";
}

Status ChunkStore::init() const {
  struct stat st {};
  if (::stat(dir_.c_str(), &st) != 0) return Error::sys(errno, "layer store " + dir_);
  if (!S_ISDIR(st.st_mode)) return Error::invalid("layer store " + dir_ + " is not a directory");
  DSEC_TRY(makeDirs(dir_ + "/chunks"));
  return makeDirs(dir_ + "/layers");
}

Result<PushReport> ChunkStore::push(const LayerManifest& layer, const std::string& image_path,
                                    int64_t chunk_size) const {
  DSEC_TRY(validateLayerRef(layer.ref));
  if (chunk_size < kMinChunkSize || chunk_size > kMaxChunkSize || chunk_size % 4096 != 0) {
    return Error::invalid("chunk size must be a multiple of 4 KiB from 4 KiB to 16 MiB");
  }
  if (auto existing = get(layer.ref); existing.ok()) {
    if (existing->layer.sha256 != layer.sha256) {
      return Error(ErrorCode::kAlreadyExists,
                   "the store has " + layer.ref.toString() + " already, with another image (versions are immutable)");
    }
    PushReport same;
    same.stored = std::move(existing).value();
    same.chunks_total = static_cast<int64_t>(same.stored.chunks.size());
    return same;
  } else if (existing.error().code() != ErrorCode::kNotFound) {
    return existing.error();
  }
  DSEC_TRY(init());
  UniqueFd fd(::open(image_path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return Error::sys(errno, "open " + image_path);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return Error::sys(errno, "stat " + image_path);
  if (st.st_size != layer.size) {
    return Error::invalid(image_path + " is " + std::to_string(st.st_size) + " bytes, its manifest says " +
                          std::to_string(layer.size));
  }
  PushReport report;
  report.stored.layer = layer;
  report.stored.chunk_size = chunk_size;
  EVP_MD_CTX* whole = EVP_MD_CTX_new();
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> whole_guard(whole, EVP_MD_CTX_free);
  if (whole == nullptr || EVP_DigestInit_ex(whole, EVP_sha256(), nullptr) != 1) return Error::internal("sha256 init");
  std::set<std::string> made_dirs;
  for (int64_t offset = 0; offset < layer.size; offset += chunk_size) {
    DSEC_ASSIGN_OR_RETURN(std::string bytes,
                          readAt(fd.get(), offset, std::min(chunk_size, layer.size - offset), image_path));
    if (static_cast<int64_t>(bytes.size()) != std::min(chunk_size, layer.size - offset)) {
      return Error::sys(EIO, image_path + " shrank while it was read");
    }
    EVP_DigestUpdate(whole, bytes.data(), bytes.size());
    std::string sha = sha256Hex(bytes);
    report.stored.chunks.push_back(sha);
    ++report.chunks_total;
    std::string path = chunkPath(sha);
    if (::access(path.c_str(), F_OK) == 0) continue;
    std::string dir = path.substr(0, path.rfind('/'));
    if (made_dirs.insert(dir).second) DSEC_TRY(makeDirs(dir));
    DSEC_TRY(writeOnce(path, bytes));
    ++report.chunks_new;
    report.bytes_new += static_cast<int64_t>(bytes.size());
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(whole, md, &len);
  if (hexEncode(std::string_view(reinterpret_cast<const char*>(md), len)) != layer.sha256) {
    return Error::invalid(image_path + " does not match its manifest's sha256 (the layer changed on the node?)");
  }
  std::string manifest = manifestPath(layer.ref);
  DSEC_TRY(makeDirs(manifest.substr(0, manifest.rfind('/'))));
  DSEC_TRY(writeOnce(manifest, report.stored.toJson().dump(1) + "\n"));
  return report;
}

Result<StoredLayer> ChunkStore::get(const LayerRef& ref) const {
  DSEC_TRY(validateLayerRef(ref));
  const std::string path = manifestPath(ref);
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) {
    if (errno == ENOENT) return Error::notFound("layer " + ref.toString() + " is not in the store " + dir_);
    return Error::sys(errno, "open " + path);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return Error::sys(errno, "stat " + path);
  if (!S_ISREG(st.st_mode) || st.st_size > kMaxManifestBytes) return corrupt(path, "not a file of a sane size");
  DSEC_ASSIGN_OR_RETURN(std::string text, readAt(fd.get(), 0, st.st_size, path));
  DSEC_ASSIGN_OR_RETURN(StoredLayer s, parseStoredLayer(text, path));
  if (s.layer.ref != ref) return corrupt(path, "it names " + s.layer.ref.toString());
  return s;
}

bool ChunkStore::exists(const LayerRef& ref) const { return get(ref).ok(); }

Result<std::vector<StoredLayer>> ChunkStore::list() const {
  std::vector<StoredLayer> out;
  auto names = listDirectory(dir_ + "/layers");
  if (!names.ok()) {
    if (names.error().code() == ErrorCode::kNotFound) return out;
    return names.error();
  }
  for (const auto& n : *names) {
    auto versions = listDirectory(dir_ + "/layers/" + n.name);
    if (!versions.ok()) continue;
    for (const auto& v : *versions) {
      auto s = get(LayerRef{n.name, v.name});
      if (s.ok()) out.push_back(std::move(s).value());
    }
  }
  std::sort(out.begin(), out.end(),
            [](const StoredLayer& a, const StoredLayer& b) { return a.layer.ref < b.layer.ref; });
  return out;
}

Result<StoreStats> ChunkStore::stats() const {
  DSEC_ASSIGN_OR_RETURN(auto layers, list());
  StoreStats s;
  std::set<std::string> seen;
  for (const auto& l : layers) {
    ++s.layers;
    s.logical_bytes += l.layer.size;
    for (size_t i = 0; i < l.chunks.size(); ++i) {
      if (seen.insert(l.chunks[i]).second) s.stored_bytes += l.chunkLength(i);
    }
  }
  s.chunks = static_cast<int64_t>(seen.size());
  return s;
}

}  // namespace dsec::fs3
