// Snapshots, restores and forks of the node agent (docs/snapshots.md). A snapshot is written by the sandbox's
// backend into a staging dir of the store (Snapshots.h) and published with the source's parameters. A container's
// (kFilesystem) is restored as a layer, snap-NAME:1, imported into this node's layer store and stacked on the
// source's image; a machine snapshot by its backend's restore(). Restores are ordinary creates otherwise: admitted,
// booked, recorded (CreateParams::snapshot names the snapshot), timed out and destroyed like any sandbox.
#include <algorithm>
#include <set>

#include "dsec/common/Logging.h"
#include "dsec/common/Process.h"
#include "dsec/common/Strings.h"
#include "dsec/launcher/node/NodeAgent.h"

namespace dsec::launcher {
namespace {

constexpr const char* kLog = "snapshots";
// How often the reaper applies the retention and removes snapshot layers whose snapshot is gone.
constexpr double kSnapshotReapSeconds = 30;
constexpr int kMaxForks = 256;
constexpr const char* kLayerSourcePrefix = "snapshot:";

Result<fs3::LayerRef> layerOf(const SnapshotMeta& meta) {
  DSEC_ASSIGN_OR_RETURN(auto refs, fs3::parseImageRef(meta.layer));
  if (refs.size() != 1) return Error::invalid("snapshot " + meta.name + " names no single layer");
  return refs[0];
}

bool stacksOn(const SnapshotMeta& meta, const fs3::LayerRef& layer) {
  auto refs = fs3::parseImageRef(meta.image);
  if (!refs.ok()) return false;
  for (const auto& r : *refs) {
    if (r == layer) return true;
  }
  return false;
}

}  // namespace

Status NodeAgent::startSnapshots() {
  std::string dir = options_.snapshot_dir.empty() ? options_.root + "/snapshots" : options_.snapshot_dir;
  snapshots_ = std::make_unique<SnapshotStore>(dir);
  // Simulated parts touch nothing of the host; their sandboxes cannot be snapshotted anyway.
  if (!backend_has_cgroups_) return okStatus();
  if (auto st = snapshots_->init(); !st.ok()) return st.error().wrap("snapshot dir " + dir);
  return okStatus();
}

Result<std::unique_ptr<backends::Sandbox>> NodeAgent::makeSandbox(const SandboxRecord& rec,
                                                                  const backends::SandboxSpec& spec) {
  backends::Backend* backend = backendFor(rec.params.backend);
  if (backend == nullptr) backend = backend_.get();
  if (!rec.params.snapshot.empty() && rec.params.backend != backends::BackendKind::kContainer) {
    return backend->restore(spec, snapshots_->pathOf(rec.params.snapshot));
  }
  return backend->create(spec);
}

Result<SnapshotMeta> NodeAgent::snapshot(const std::string& id, const std::string& requested_name, bool processes) {
  auto rec = find(id);
  if (!rec) return Error::notFound("no sandbox " + id);
  if (processes && rec->params.backend == backends::BackendKind::kContainer) {
    return Error::invalid(
        "container snapshots carry files only, not processes or memory; use a microvm or vm sandbox to snapshot "
        "its processes");
  }
  const std::string name = requested_name.empty() ? generateSnapshotName() : requested_name;
  DSEC_ASSIGN_OR_RETURN(SnapshotStore::Staging staging, snapshots_->begin(name));
  SnapshotMeta meta;
  double t0 = monotonicSeconds();
  {
    // No pause, resume or destroy while the backend captures it.
    std::lock_guard lock(rec->mu);
    if (rec->destroyed) return Error::notFound("no sandbox " + id);
    auto kind = rec->sandbox->snapshot(staging.path());
    if (!kind.ok()) return kind.error().wrap("snapshot of " + id);
    meta.kind = *kind;
    meta.params = rec->params;
  }
  meta.backend = meta.params.backend;
  meta.image = meta.params.image;
  meta.source = id;
  meta.node = options_.node_name;
  if (meta.kind == backends::SnapshotKind::kFilesystem) meta.layer = snapshotLayerName(name);
  DSEC_TRY(staging.publish(meta));
  DSEC_LOG(kInfo, kLog) << "snapshot " << name << " of " << id << " (" << backends::snapshotKindName(meta.kind) << ", "
                        << meta.bytes << " bytes) in " << (monotonicSeconds() - t0) << " s";
  return meta;
}

Result<CreateParams> NodeAgent::restoreParams(const SnapshotMeta& meta, const RestoreOptions& options) {
  CreateParams p = meta.params;
  p.snapshot = meta.name;
  p.backend = meta.backend;
  if (meta.kind == backends::SnapshotKind::kFilesystem) {
    p.image = meta.image + "+" + meta.layer;
    auto layers = fs3::parseImageRef(p.image);
    if (!layers.ok()) return layers.error().wrap("snapshot " + meta.name);
    p.layers = std::move(*layers);
  }
  p.labels = options.labels.value_or(std::map<std::string, std::string>{});
  p.session = options.session.value_or("");
  if (options.timeout) p.timeout = *options.timeout;
  if (options.idle_timeout) p.idle_timeout = *options.idle_timeout;
  return p;
}

Result<SandboxInfo> NodeAgent::restore(const std::string& name, const RestoreOptions& options) {
  DSEC_ASSIGN_OR_RETURN(SnapshotMeta meta, snapshots_->get(name));
  if (meta.kind == backends::SnapshotKind::kFilesystem) {
    DSEC_ASSIGN_OR_RETURN(fs3::LayerRef layer, layerOf(meta));
    if (!images_->check({layer}).ok()) {
      Status imported =
          images_->importLayer(layer, snapshots_->pathOf(name) + "/upper.erofs", meta.image, kLayerSourcePrefix + name);
      if (!imported.ok() && imported.error().code() != ErrorCode::kAlreadyExists) {
        return imported.error().wrap("importing snapshot " + name + " as layer " + meta.layer);
      }
    }
  } else if (backendFor(meta.backend) == nullptr) {
    return Error(ErrorCode::kUnsupported, "snapshot " + name + " is of a " + backends::backendKindName(meta.backend) +
                                              " sandbox, which this node cannot run");
  }
  DSEC_ASSIGN_OR_RETURN(CreateParams params, restoreParams(meta, options));
  return create(params);
}

Result<ForkResult> NodeAgent::fork(const std::string& id, int count, bool processes) {
  if (count < 1 || count > kMaxForks) {
    return Error::invalid("count must be 1.." + std::to_string(kMaxForks) + ", not " + std::to_string(count));
  }
  auto rec = find(id);
  if (!rec) return Error::notFound("no sandbox " + id);
  RestoreOptions copies;
  copies.timeout = rec->timeout.load();
  copies.idle_timeout = rec->params.idle_timeout;
  copies.labels = rec->params.labels;
  copies.session = rec->params.session;
  ForkResult out;
  DSEC_ASSIGN_OR_RETURN(out.snapshot, snapshot(id, "", processes));
  for (int i = 0; i < count; ++i) {
    auto made = restore(out.snapshot.name, copies);
    if (made.ok()) {
      out.sandboxes.push_back(std::move(*made));
      continue;
    }
    for (const auto& info : out.sandboxes) (void)destroy(info.id, "fork failed");
    return made.error().wrap("fork " + std::to_string(i + 1) + " of " + std::to_string(count) + " of " + id +
                             " failed (the " + std::to_string(i) + " made before it are destroyed; snapshot " +
                             out.snapshot.name + " is kept)");
  }
  return out;
}

std::vector<SnapshotMeta> NodeAgent::listSnapshots() { return snapshots_->list(); }

Result<SnapshotMeta> NodeAgent::getSnapshot(const std::string& name) { return snapshots_->get(name); }

Status NodeAgent::deleteSnapshot(const std::string& name) {
  auto meta = snapshots_->get(name);
  if (!meta.ok() && meta.error().code() != ErrorCode::kNotFound) return meta.error();
  if (meta.ok() && !meta->layer.empty()) {
    DSEC_ASSIGN_OR_RETURN(fs3::LayerRef layer, layerOf(*meta));
    for (const auto& other : snapshots_->list()) {
      if (other.name != name && stacksOn(other, layer)) {
        return Error(ErrorCode::kConflict,
                     "snapshot " + other.name + " was taken of a sandbox restored from " + name + "; delete it first");
      }
    }
  }
  DSEC_TRY(snapshots_->remove(name));  // a snapshot.json that cannot be read still goes
  DSEC_LOG(kInfo, kLog) << "deleted snapshot " << name;
  if (!meta.ok() || meta->layer.empty()) return okStatus();
  auto layer = layerOf(*meta);
  Status removed = layer.ok() ? images_->removeLayer(*layer) : Status(layer.error());
  if (!removed.ok() && removed.error().code() != ErrorCode::kNotFound) {
    // In use by a sandbox restored from it: the reaper removes it once none is left.
    DSEC_LOG(kInfo, kLog) << "layer " << meta->layer << " stays while it is used: " << removed.error().message();
  }
  return okStatus();
}

void NodeAgent::reapSnapshots() {
  if (!snapshots_ || !backend_has_cgroups_) return;
  const double now = monotonicSeconds();
  const double retention = options_.snapshot_retention_seconds;
  if (now - snapshots_reaped_mono_.load() <
      (retention > 0 ? std::min(kSnapshotReapSeconds, retention) : kSnapshotReapSeconds)) {
    return;
  }
  snapshots_reaped_mono_.store(now);
  std::set<std::string> kept;
  const double cutoff = wallSeconds() - options_.snapshot_retention_seconds;
  for (const auto& meta : snapshots_->list()) {
    if (options_.snapshot_retention_seconds > 0 && meta.created_unix < cutoff) {
      Status st = deleteSnapshot(meta.name);
      if (st.ok()) {
        DSEC_LOG(kInfo, kLog) << "snapshot " << meta.name << " is past its retention";
        continue;
      }
      DSEC_LOG(kWarn, kLog) << "snapshot " << meta.name << " is past its retention but stays: " << st.error().message();
    }
    kept.insert(meta.name);
  }
  // Layers imported from snapshots that are gone (deleted here or by another node of the fleet) and that no
  // sandbox of this node holds any more.
  auto layers = images_->layers();
  if (!layers.ok()) return;
  for (const auto& layer : *layers) {
    const std::string& source = layer.manifest.source;
    if (layer.refs > 0 || !startsWith(source, kLayerSourcePrefix)) continue;
    const std::string name = source.substr(std::string_view(kLayerSourcePrefix).size());
    if (kept.count(name) || snapshots_->get(name).ok()) continue;
    if (images_->removeLayer(layer.manifest.ref).ok()) {
      DSEC_LOG(kInfo, kLog) << "removed layer " << layer.manifest.ref.toString() << " of deleted snapshot " << name;
    }
  }
}

}  // namespace dsec::launcher
