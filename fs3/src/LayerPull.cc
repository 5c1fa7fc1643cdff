#include "dsec/fs3/LayerPull.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

namespace dsec::fs3 {

Result<PullReport> pullLayer(SharedStore& store, const StoredLayer& layer, LayerStore& local, int threads) {
  PullReport report;
  report.layer = layer.layer;
  auto write_image = [&](int fd) -> Status {
    std::atomic<size_t> next{0};
    std::atomic<bool> failed{false};
    std::mutex mu;
    std::optional<Error> first_error;
    auto fail = [&](Error e) {
      std::lock_guard lock(mu);
      if (!first_error) first_error = std::move(e);
      failed = true;
    };
    auto worker = [&] {
      for (size_t i = next.fetch_add(1); i < layer.chunks.size() && !failed; i = next.fetch_add(1)) {
        const std::string& sha = layer.chunks[i];
        const int64_t length = layer.chunkLength(i);
        auto bytes = store.fetch(sha, length);
        if (!bytes.ok()) return fail(bytes.error());
        if (static_cast<int64_t>(bytes->size()) != length || sha256Hex(*bytes) != sha) {
          return fail(Error(ErrorCode::kSystem,
                            "chunk " + sha.substr(0, 12) + " of " + layer.layer.ref.toString() + " from " +
                                store.location() + " fails its hash",
                            EIO));
        }
        const auto offset = static_cast<off_t>(static_cast<int64_t>(i) * layer.chunk_size);
        for (size_t done = 0; done < bytes->size();) {
          ssize_t n = ::pwrite(fd, bytes->data() + done, bytes->size() - done, offset + static_cast<off_t>(done));
          if (n < 0 && errno == EINTR) continue;
          if (n <= 0) return fail(Error::sys(n < 0 ? errno : EIO, "writing " + layer.layer.ref.toString()));
          done += static_cast<size_t>(n);
        }
      }
    };
    std::vector<std::thread> pool;
    for (int t = 0; t < std::clamp(threads, 1, 256); ++t) pool.emplace_back(worker);
    for (auto& t : pool) t.join();
    if (first_error) return *first_error;
    return okStatus();
  };
  DSEC_ASSIGN_OR_RETURN(report.layer, local.installImage(layer.layer, write_image));
  report.chunks = static_cast<int64_t>(layer.chunks.size());
  report.bytes = layer.layer.size;
  return report;
}

}  // namespace dsec::fs3
