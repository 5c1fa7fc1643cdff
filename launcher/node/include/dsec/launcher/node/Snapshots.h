// The node's snapshot store (docs/snapshots.md): plain files under one directory, which a fleet shares
// (<fleet root>/snapshots) so that any node restores any snapshot.
//   <dir>/<name>/snapshot.json  {"version", "name", "kind", "backend", "image", "layer", "source", "node",
//                                "created_unix", "bytes", "params"}
//   <dir>/<name>/...            the backend's files (a container's upper.erofs; a machine snapshot's own)
// A snapshot is written in <dir>/.tmp-<hex>/ and renamed into place, so one that is visible is complete; a name
// is taken by whichever rename comes first. Directories are root's, 0700. A snapshot.json that cannot be read is
// skipped (with a log line) by listings and is not found by name.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dsec/backends/Sandbox.h"
#include "dsec/common/Result.h"
#include "dsec/launcher/node/CreateParams.h"

namespace dsec::launcher {

struct SnapshotMeta {
  std::string name;
  backends::SnapshotKind kind = backends::SnapshotKind::kFilesystem;
  backends::BackendKind backend = backends::BackendKind::kContainer;
  std::string image;   // the source's image
  std::string layer;   // kFilesystem: the layer it is restored as ("snap-NAME:1"), stacked on image
  std::string source;  // the source sandbox's id
  std::string node;    // where it was taken
  double created_unix = 0;
  int64_t bytes = 0;    // of its files
  CreateParams params;  // the source's: image, limits, network, env, labels, session, timeouts
};

// [a-z0-9][a-z0-9._-]{0,63}; kInvalidArgument naming the rule.
Status validateSnapshotName(const std::string& name);
// "snap-<12 hex>".
std::string generateSnapshotName();
// The layer a container snapshot is restored as: "snap-NAME:1" (a long name is cut and a hash of it added, so
// it fits a layer name).
std::string snapshotLayerName(const std::string& name);

// What a restore from a snapshot may set; the rest comes from the snapshot (NodeAgentSnapshots.cc). Unset
// timeouts are the source's; unset labels and session are none.
struct RestoreOptions {
  std::optional<double> timeout;
  std::optional<double> idle_timeout;
  std::optional<std::map<std::string, std::string>> labels;
  std::optional<std::string> session;
};

class SnapshotStore {
 public:
  explicit SnapshotStore(std::string dir) : dir_(std::move(dir)) {}
  // Makes the directory (0700, root's) and removes staging dirs older than an hour (another node of a fleet
  // may be writing a young one).
  Status init();
  const std::string& dir() const { return dir_; }
  std::string pathOf(const std::string& name) const { return dir_ + "/" + name; }

  // A snapshot being written: the backend fills path(); publish() writes snapshot.json and renames it into
  // place. Dropped unpublished, it is removed.
  class Staging {
   public:
    Staging(Staging&& other) noexcept;
    Staging& operator=(Staging&&) = delete;
    ~Staging();
    const std::string& path() const { return path_; }
    // Sets meta.bytes (the files' sizes) and meta.created_unix (when 0). kAlreadyExists if the name was taken.
    Status publish(SnapshotMeta& meta);

   private:
    friend class SnapshotStore;
    Staging(const SnapshotStore* store, std::string name, std::string path)
        : store_(store), name_(std::move(name)), path_(std::move(path)) {}
    const SnapshotStore* store_;
    std::string name_;
    std::string path_;
    bool published_ = false;
  };
  // kAlreadyExists if the name is taken.
  Result<Staging> begin(const std::string& name);

  Result<SnapshotMeta> get(const std::string& name) const;  // kNotFound
  std::vector<SnapshotMeta> list() const;                   // by name; unreadable ones skipped and logged
  // Renamed away at once, then removed. kNotFound if missing.
  Status remove(const std::string& name);

 private:
  std::string dir_;
};

std::string encodeSnapshotMeta(const SnapshotMeta& meta);
// kInvalidArgument naming what is wrong.
Result<SnapshotMeta> decodeSnapshotMeta(const std::string& text);

}  // namespace dsec::launcher
