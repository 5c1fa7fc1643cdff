#include "dsec/fs3/StoreMaintenance.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <ctime>
#include <nlohmann/json.hpp>

#include "dsec/common/Directory.h"
#include "dsec/common/Strings.h"

namespace dsec::fs3 {
namespace {

std::string hostName() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) return "unknown";
  return host;
}

std::string leasesDir(const ChunkStore& store) { return store.dir() + "/leases"; }
std::string ownLease(const ChunkStore& store) { return leasesDir(store) + "/" + ownLeaseName() + ".json"; }

Status validateLeaseName(const std::string& name) {
  bool ok = !name.empty() && name.size() <= 200 && name[0] != '.';
  for (char c : name) ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-');
  return ok ? okStatus() : Error::invalid("not a lease name: '" + name.substr(0, 64) + "'");
}

double ageSeconds(const struct stat& st) {
  return static_cast<double>(::time(nullptr)) - static_cast<double>(st.st_mtim.tv_sec);
}

}  // namespace

std::string ownLeaseName() { return hostName() + "." + std::to_string(::getpid()); }

Status writeLeaseAs(const ChunkStore& store, const std::string& name, const std::string& host,
                    const std::set<LayerRef>& layers) {
  DSEC_TRY(validateLeaseName(name));
  nlohmann::json names = nlohmann::json::array();
  for (const auto& l : layers) names.push_back(l.toString());
  DSEC_TRY(makeDirs(leasesDir(store)));
  nlohmann::json j{{"host", host}, {"layers", names}};
  return writeFileAtomic(leasesDir(store) + "/" + name + ".json", j.dump() + "\n", 0644);
}

Status removeLeaseAs(const ChunkStore& store, const std::string& name) {
  DSEC_TRY(validateLeaseName(name));
  if (::unlink((leasesDir(store) + "/" + name + ".json").c_str()) != 0 && errno != ENOENT) {
    return Error::sys(errno, "removing lease " + name);
  }
  return okStatus();
}

Status writeLease(const ChunkStore& store, const std::set<LayerRef>& layers) {
  return writeLeaseAs(store, ownLeaseName(), hostName(), layers);
}

void removeLease(const ChunkStore& store) { ::unlink(ownLease(store).c_str()); }

Result<std::vector<LiveLease>> liveLeases(const ChunkStore& store) {
  std::vector<LiveLease> out;
  auto entries = listDirectory(leasesDir(store));
  if (!entries.ok()) {
    if (entries.error().code() == ErrorCode::kNotFound) return out;
    return entries.error();
  }
  for (const auto& e : *entries) {
    std::string path = leasesDir(store) + "/" + e.name;
    struct stat st {};
    if (!e.name.ends_with(".json") || ::stat(path.c_str(), &st) != 0 || ageSeconds(st) > kLeaseFreshSeconds) continue;
    auto text = readFile(path);
    if (!text.ok()) continue;
    auto j = nlohmann::json::parse(*text, nullptr, false);
    LiveLease lease;
    lease.file = path;
    if (j.is_object()) {
      lease.host = j.value("host", "");
      if (j.contains("layers") && j["layers"].is_array()) {
        for (const auto& n : j["layers"]) {
          if (!n.is_string()) continue;
          if (auto ref = parseLayerRef(n.get<std::string>()); ref.ok()) lease.layers.push_back(*ref);
        }
      }
    }
    out.push_back(std::move(lease));
  }
  return out;
}

Status removeStoredLayer(const ChunkStore& store, const LayerRef& ref) {
  DSEC_TRY(validateLayerRef(ref));
  if (::access(store.manifestPath(ref).c_str(), F_OK) != 0) {
    return Error::notFound("layer " + ref.toString() + " is not in the store " + store.dir());
  }
  DSEC_ASSIGN_OR_RETURN(auto leases, liveLeases(store));
  for (const auto& lease : leases) {
    for (const auto& l : lease.layers) {
      if (l == ref) {
        return Error(ErrorCode::kConflict,
                     "layer " + ref.toString() + " is in use on " + (lease.host.empty() ? lease.file : lease.host));
      }
    }
  }
  std::string dir = store.dir() + "/layers/" + ref.name + "/" + ref.version;
  DSEC_TRY(removeTree(dir));
  ::rmdir((store.dir() + "/layers/" + ref.name).c_str());  // the name's dir, once it holds no version
  return okStatus();
}

Result<GcReport> collectGarbage(const ChunkStore& store, double grace_seconds, bool dry_run) {
  // Every manifest must be readable: the chunks of one that is not would look like garbage.
  std::set<std::string> referenced;
  std::set<LayerRef> present;
  auto names = listDirectory(store.dir() + "/layers");
  if (names.ok()) {
    for (const auto& n : *names) {
      auto versions = listDirectory(store.dir() + "/layers/" + n.name);
      if (!versions.ok()) continue;
      for (const auto& v : *versions) {
        LayerRef ref{n.name, v.name};
        if (::access(store.manifestPath(ref).c_str(), F_OK) != 0) continue;  // a push not finished, or removed
        auto layer = store.get(ref);
        if (!layer.ok()) return layer.error().wrap("gc refused: cannot read every manifest");
        referenced.insert(layer->chunks.begin(), layer->chunks.end());
        present.insert(ref);
      }
    }
  }
  DSEC_ASSIGN_OR_RETURN(auto leases, liveLeases(store));
  for (const auto& lease : leases) {
    for (const auto& l : lease.layers) {
      if (present.count(l) == 0) {
        return Error(ErrorCode::kConflict, "gc refused: " + (lease.host.empty() ? lease.file : lease.host) +
                                               " still uses layer " + l.toString() + ", which the store no longer has");
      }
    }
  }
  GcReport report;
  auto prefixes = listDirectory(store.dir() + "/chunks");
  if (!prefixes.ok()) return report;
  for (const auto& p : *prefixes) {
    std::string dir = store.dir() + "/chunks/" + p.name;
    auto files = listDirectory(dir);
    if (!files.ok()) continue;
    for (const auto& f : *files) {
      if (referenced.count(f.name) != 0) {
        ++report.chunks_kept;
        continue;
      }
      std::string path = dir + "/" + f.name;
      struct stat st {};
      if (::lstat(path.c_str(), &st) != 0) continue;
      if (ageSeconds(st) < grace_seconds) {
        ++report.chunks_too_new;
        continue;
      }
      if (!dry_run && ::unlink(path.c_str()) != 0) return Error::sys(errno, "remove " + path);
      ++report.chunks_removed;
      report.bytes_removed += st.st_size;
    }
  }
  return report;
}

}  // namespace dsec::fs3
