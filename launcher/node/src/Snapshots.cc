#include "dsec/launcher/node/Snapshots.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <ctime>

#include "dsec/common/Directory.h"
#include "dsec/common/Logging.h"
#include "dsec/common/Strings.h"
#include "dsec/launcher/node/StateRecord.h"

namespace dsec::launcher {
namespace {

constexpr const char* kLog = "snapshots";
constexpr const char* kMetaFile = "snapshot.json";
constexpr const char* kStagingPrefix = ".tmp-";
constexpr int kMetaVersion = 1;
constexpr double kStaleStagingSeconds = 3600;

double nowUnix() { return static_cast<double>(::time(nullptr)); }

// Regular files' sizes below dir (not following links).
int64_t treeBytes(const std::string& dir) {
  auto entries = listDirectory(dir);
  if (!entries.ok()) return 0;
  int64_t sum = 0;
  for (const auto& e : *entries) {
    std::string path = dir + "/" + e.name;
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) continue;
    if (S_ISDIR(st.st_mode)) {
      sum += treeBytes(path);
    } else if (S_ISREG(st.st_mode)) {
      // What the file takes on disk: a machine snapshot's RAM file is sparse (only the pages its guest touched).
      sum += std::min<int64_t>(st.st_size, static_cast<int64_t>(st.st_blocks) * 512);
    }
  }
  return sum;
}

}  // namespace

Status validateSnapshotName(const std::string& name) {
  auto lead = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
  bool ok = !name.empty() && name.size() <= 64 && lead(name[0]);
  for (size_t i = 1; ok && i < name.size(); ++i)
    ok = lead(name[i]) || name[i] == '.' || name[i] == '_' || name[i] == '-';
  if (!ok) return Error::invalid("snapshot name \"" + name + "\" must match [a-z0-9][a-z0-9._-]{0,63}");
  return okStatus();
}

std::string generateSnapshotName() { return "snap-" + randomHex(12); }

std::string snapshotLayerName(const std::string& name) {
  constexpr size_t kMaxLayerName = 64;
  std::string layer = "snap-" + name;
  if (layer.size() > kMaxLayerName) {
    uint64_t h = 1469598103934665603ULL;  // FNV-1a: the same name gives the same layer on every node
    for (unsigned char c : name) {
      h ^= c;
      h *= 1099511628211ULL;
    }
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
    layer = "snap-" + name.substr(0, kMaxLayerName - 5 - 17) + "-" + hex;
  }
  return layer + ":1";
}

std::string encodeSnapshotMeta(const SnapshotMeta& m) {
  nlohmann::json j{{"version", kMetaVersion},
                   {"name", m.name},
                   {"kind", backends::snapshotKindName(m.kind)},
                   {"backend", backends::backendKindName(m.backend)},
                   {"image", m.image},
                   {"layer", m.layer},
                   {"source", m.source},
                   {"node", m.node},
                   {"created_unix", m.created_unix},
                   {"bytes", m.bytes},
                   {"params", paramsRecordJson(m.params)}};
  return j.dump(2) + "\n";
}

Result<SnapshotMeta> decodeSnapshotMeta(const std::string& text) {
  try {
    auto j = nlohmann::json::parse(text);
    if (!j.is_object()) return Error::invalid("snapshot.json is not an object");
    if (j.value("version", 0) != kMetaVersion) return Error::invalid("snapshot.json has an unknown version");
    SnapshotMeta m;
    m.name = j.at("name").get<std::string>();
    DSEC_TRY(validateSnapshotName(m.name));
    std::string kind = j.at("kind").get<std::string>();
    if (kind == backends::snapshotKindName(backends::SnapshotKind::kFilesystem)) {
      m.kind = backends::SnapshotKind::kFilesystem;
    } else if (kind == backends::snapshotKindName(backends::SnapshotKind::kMachine)) {
      m.kind = backends::SnapshotKind::kMachine;
    } else {
      return Error::invalid("snapshot.json has an unknown kind \"" + kind + "\"");
    }
    DSEC_ASSIGN_OR_RETURN(m.backend, backends::parseBackendKind(j.at("backend").get<std::string>()));
    m.image = j.at("image").get<std::string>();
    m.layer = j.value("layer", "");
    m.source = j.value("source", "");
    m.node = j.value("node", "");
    m.created_unix = j.value("created_unix", 0.0);
    m.bytes = j.value("bytes", int64_t{0});
    DSEC_ASSIGN_OR_RETURN(m.params, paramsFromJson(j.at("params")));
    if (m.kind == backends::SnapshotKind::kFilesystem && m.layer.empty()) {
      return Error::invalid("snapshot.json of a filesystem snapshot names no layer");
    }
    return m;
  } catch (const nlohmann::json::exception& e) {
    return Error::invalid(std::string("snapshot.json: ") + e.what());
  }
}

Status SnapshotStore::init() {
  DSEC_TRY(makeDirs(dir_, 0700));
  if (::chmod(dir_.c_str(), 0700) != 0) return Error::sys(errno, "chmod " + dir_);
  DSEC_ASSIGN_OR_RETURN(auto entries, listDirectory(dir_));
  for (const auto& e : entries) {
    if (!startsWith(e.name, kStagingPrefix)) continue;
    std::string path = pathOf(e.name);
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0 || nowUnix() - static_cast<double>(st.st_mtime) < kStaleStagingSeconds) {
      continue;
    }
    if (auto st2 = removeTree(path); !st2.ok()) DSEC_LOG(kWarn, kLog) << st2.error().toString();
  }
  return okStatus();
}

SnapshotStore::Staging::Staging(Staging&& other) noexcept
    : store_(other.store_),
      name_(std::move(other.name_)),
      path_(std::exchange(other.path_, {})),
      published_(other.published_) {}

SnapshotStore::Staging::~Staging() {
  if (published_ || path_.empty()) return;
  if (auto st = removeTree(path_); !st.ok()) DSEC_LOG(kWarn, kLog) << st.error().toString();
}

Status SnapshotStore::Staging::publish(SnapshotMeta& meta) {
  meta.name = name_;
  if (meta.created_unix == 0) meta.created_unix = nowUnix();
  meta.bytes = treeBytes(path_);
  DSEC_TRY(writeFileAtomic(path_ + "/" + kMetaFile, encodeSnapshotMeta(meta), 0600));
  std::string dest = store_->pathOf(name_);
  if (::rename(path_.c_str(), dest.c_str()) != 0) {
    int err = errno;
    if (err == EEXIST || err == ENOTEMPTY) return Error(ErrorCode::kAlreadyExists, "snapshot " + name_ + " exists");
    return Error::sys(err, "rename " + path_ + " to " + dest);
  }
  published_ = true;
  return okStatus();
}

Result<SnapshotStore::Staging> SnapshotStore::begin(const std::string& name) {
  DSEC_TRY(validateSnapshotName(name));
  if (::access(pathOf(name).c_str(), F_OK) == 0) {
    return Error(ErrorCode::kAlreadyExists, "snapshot " + name + " exists");
  }
  std::string path = pathOf(kStagingPrefix + randomHex(16));
  if (::mkdir(path.c_str(), 0700) != 0) return Error::sys(errno, "mkdir " + path);
  return Staging(this, name, path);
}

Result<SnapshotMeta> SnapshotStore::get(const std::string& name) const {
  DSEC_TRY(validateSnapshotName(name));
  auto text = readFile(pathOf(name) + "/" + kMetaFile);
  if (!text.ok()) {
    if (text.error().sysErrno() == ENOENT) return Error::notFound("no snapshot " + name);
    return text.error();
  }
  auto meta = decodeSnapshotMeta(*text);
  if (!meta.ok()) {
    DSEC_LOG(kWarn, kLog) << "skipping snapshot " << name << ": " << meta.error().message();
    return Error::notFound("no snapshot " + name + " (its snapshot.json cannot be read)");
  }
  if (meta->name != name) return Error::notFound("no snapshot " + name + " (its snapshot.json names another)");
  return meta;
}

std::vector<SnapshotMeta> SnapshotStore::list() const {
  std::vector<SnapshotMeta> out;
  auto entries = listDirectory(dir_);
  if (!entries.ok()) {
    if (entries.error().code() != ErrorCode::kNotFound) DSEC_LOG(kWarn, kLog) << entries.error().toString();
    return out;
  }
  for (const auto& e : *entries) {
    if (!e.is_dir || startsWith(e.name, ".") || !validateSnapshotName(e.name).ok()) continue;
    auto meta = get(e.name);
    if (meta.ok()) out.push_back(std::move(*meta));
  }
  std::sort(out.begin(), out.end(), [](const SnapshotMeta& a, const SnapshotMeta& b) { return a.name < b.name; });
  return out;
}

Status SnapshotStore::remove(const std::string& name) {
  DSEC_TRY(validateSnapshotName(name));
  std::string path = pathOf(name);
  std::string grave = pathOf(kStagingPrefix + randomHex(16));
  if (::rename(path.c_str(), grave.c_str()) != 0) {
    if (errno == ENOENT) return Error::notFound("no snapshot " + name);
    return Error::sys(errno, "rename " + path);
  }
  return removeTree(grave);
}

}  // namespace dsec::launcher
