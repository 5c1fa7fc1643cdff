#include "dsec/fs3/Prefetch.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "Manifest.h"
#include "dsec/common/Logging.h"
#include "dsec/common/Strings.h"
#include "dsec/fs3/LazyLayerFs.h"

namespace dsec::fs3 {
namespace {

constexpr const char* kLog = "fs3";
constexpr int kFormat = 1;

// A recording read from `where`, or nullopt (logged) when it is unusable.
std::optional<std::vector<size_t>> usableRecording(const std::string& text, const StoredLayer& layer,
                                                   const std::string& where) {
  auto chunks = parseRecording(text, layer);
  if (chunks.ok()) return std::move(chunks).value();
  DSEC_LOG(kWarn, kLog) << "prefetch recording " << where << " not used: " << chunks.error().message();
  return std::nullopt;
}

Status writeAtomically(const std::string& path, const std::string& text) {
  DSEC_TRY(makeDirs(path.substr(0, path.rfind('/'))));
  return writeFileAtomic(path, text, 0644);
}

}  // namespace

Result<std::vector<size_t>> parseRecording(const std::string& text, const StoredLayer& layer) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("checksum") || !j["checksum"].is_string()) {
    return Error::invalid("not a recording");
  }
  std::string checksum = j["checksum"].get<std::string>();
  j.erase("checksum");
  if (sha256Hex(j.dump()) != checksum) return Error::invalid("its checksum does not match");
  try {
    if (j.at("format").get<int>() != kFormat) return Error::invalid("unknown format");
    if (j.at("layer_sha256").get<std::string>() != layer.layer.sha256)
      return Error::invalid("recorded for other bytes");
    auto chunks = j.at("chunks").get<std::vector<size_t>>();
    std::set<size_t> seen;
    for (size_t c : chunks) {
      if (c >= layer.chunks.size() || !seen.insert(c).second) {
        return Error::invalid("a chunk index out of range or twice");
      }
    }
    return chunks;
  } catch (const nlohmann::json::exception& e) {
    return Error::invalid(e.what());
  }
}

std::string storeRecordingPath(const ChunkStore& store, const LayerRef& ref) {
  return store.dir() + "/layers/" + ref.name + "/" + ref.version + "/prefetch.json";
}

std::string localRecordingPath(const std::string& local_dir, const LayerRef& ref) {
  return local_dir + "/" + lazyFileName(ref) + ".prefetch.json";
}

std::optional<std::vector<size_t>> readRecording(SharedStore& store, const std::string& local_dir,
                                                 const StoredLayer& layer) {
  const LayerRef& ref = layer.layer.ref;
  if (auto shared = store.recording(ref); shared.ok()) {
    if (auto chunks = usableRecording(*shared, layer, "of " + ref.toString() + " in " + store.location()))
      return chunks;
  }
  if (local_dir.empty()) return std::nullopt;
  const std::string local = localRecordingPath(local_dir, ref);
  auto text = readFile(local);
  if (!text.ok()) return std::nullopt;
  return usableRecording(*text, layer, local);
}

Result<std::string> writeRecording(SharedStore& store, const std::string& local_dir, const StoredLayer& layer,
                                   const std::vector<size_t>& chunks) {
  nlohmann::json j{{"format", kFormat},
                   {"layer", layer.layer.ref.toString()},
                   {"layer_sha256", layer.layer.sha256},
                   {"recorded", nowRfc3339()},
                   {"chunks", chunks}};
  j["checksum"] = sha256Hex(j.dump());
  const std::string text = j.dump() + "\n";
  Status st = store.putRecording(layer.layer.ref, text);
  if (st.ok()) return store.location();
  if (local_dir.empty()) return st.error();
  // A node may only read the store: then the recording serves this node alone.
  const std::string local = localRecordingPath(local_dir, layer.layer.ref);
  DSEC_TRY(writeAtomically(local, text));
  DSEC_LOG(kInfo, kLog) << "prefetch recording of " << layer.layer.ref.toString() << " kept on this node ("
                        << st.error().message() << ")";
  return local;
}

PrefetchResult prefetchChunks(ChunkCache& cache, const StoredLayer& layer, const std::vector<size_t>& chunks,
                              int threads, const std::atomic<bool>* stop) {
  std::atomic<size_t> next{0};
  std::atomic<int64_t> fetched{0}, cached{0}, failed{0}, bytes{0};
  auto worker = [&] {
    for (;;) {
      if (stop != nullptr && stop->load()) return;
      size_t i = next.fetch_add(1);
      if (i >= chunks.size()) return;
      size_t index = chunks[i];
      if (index >= layer.chunks.size()) continue;
      const std::string& sha = layer.chunks[index];
      if (cache.contains(sha)) {
        ++cached;
        continue;
      }
      bool was_fetched = false;
      auto fd = cache.open(sha, layer.chunkLength(index), &was_fetched);
      if (!fd.ok()) {
        ++failed;
      } else if (was_fetched) {
        ++fetched;
        bytes += layer.chunkLength(index);
      } else {
        ++cached;  // another reader fetched it meanwhile
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < std::max(1, threads); ++t) pool.emplace_back(worker);
  for (auto& t : pool) t.join();
  return PrefetchResult{fetched.load(), cached.load(), failed.load(), bytes.load()};
}

}  // namespace dsec::fs3
