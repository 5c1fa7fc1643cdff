#include "dsec/fs3/ChunkCache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <thread>
#include <tuple>
#include <vector>

#include "dsec/common/Directory.h"
#include "dsec/common/FdIo.h"
#include "dsec/common/Logging.h"
#include "dsec/common/Strings.h"
#include "dsec/fs3/ChunkStore.h"

namespace dsec::fs3 {
namespace {

constexpr const char* kLog = "fs3";

Error eio(const std::string& message) { return Error(ErrorCode::kSystem, message, EIO); }

bool transient(int err) {
  return err == ENOENT || err == EIO || err == ESTALE || err == ENOTCONN || err == ETIMEDOUT || err == EAGAIN ||
         err == EHOSTDOWN || err == ENODEV;
}

}  // namespace

StoreChunkSource::StoreChunkSource(std::string store_dir, double retry_seconds)
    : store_dir_(std::move(store_dir)), retry_seconds_(retry_seconds) {}

Result<std::string> StoreChunkSource::fetch(const std::string& sha256, int64_t length) {
  const std::string path = store_dir_ + "/chunks/" + sha256.substr(0, 2) + "/" + sha256;
  const double deadline = monotonicSeconds() + retry_seconds_;
  double backoff = 0.05;
  for (;;) {
    int err = 0;
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
    if (fd) {
      std::string bytes(static_cast<size_t>(length) + 1, '\0');  // one more: a longer file is caught
      size_t got = 0;
      while (got < bytes.size()) {
        ssize_t n = ::read(fd.get(), bytes.data() + got, bytes.size() - got);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
          err = errno;
          break;
        }
        if (n == 0) break;
        got += static_cast<size_t>(n);
      }
      if (err == 0) {
        bytes.resize(got);
        return bytes;
      }
    } else {
      err = errno;
    }
    if (!transient(err) || monotonicSeconds() + backoff > deadline) {
      return Error(ErrorCode::kSystem, "chunk " + sha256.substr(0, 12) + " from " + store_dir_ + ": " + strerror(err),
                   EIO);
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(backoff));
    backoff = std::min(backoff * 2, 1.0);
  }
}

ChunkCache::ChunkCache(std::string dir, int64_t capacity_bytes, std::shared_ptr<ChunkSource> source)
    : dir_(std::move(dir)), capacity_(capacity_bytes), source_(std::move(source)) {}

std::string ChunkCache::pathOf(const std::string& sha256) const {
  return dir_ + "/" + sha256.substr(0, 2) + "/" + sha256;
}

Status ChunkCache::init() {
  DSEC_TRY(makeDirs(dir_, 0700));
  if (::chmod(dir_.c_str(), 0700) != 0) return Error::sys(errno, "chmod " + dir_);
  DSEC_ASSIGN_OR_RETURN(auto subdirs, listDirectory(dir_));
  std::vector<std::tuple<int64_t, std::string, int64_t>> found;  // mtime ns, sha, bytes
  for (const auto& sub : subdirs) {
    if (!sub.is_dir) continue;
    auto files = listDirectory(dir_ + "/" + sub.name);
    if (!files.ok()) continue;
    for (const auto& f : *files) {
      std::string path = dir_ + "/" + sub.name + "/" + f.name;
      struct stat st {};
      if (!isSha256Hex(f.name) || f.name.substr(0, 2) != sub.name || ::lstat(path.c_str(), &st) != 0 ||
          !S_ISREG(st.st_mode)) {
        ::unlink(path.c_str());  // half-written (name.tmp.*) or not ours
        continue;
      }
      found.emplace_back(static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec, f.name, st.st_size);
    }
  }
  std::sort(found.begin(), found.end());
  std::lock_guard lock(mu_);
  for (const auto& [mtime, sha, bytes] : found) {
    lru_.push_front(sha);
    entries_[sha] = Entry{bytes, lru_.begin()};
    bytes_ += bytes;
  }
  evictLocked("");
  return okStatus();
}

void ChunkCache::touchLocked(const std::string& sha256) {
  auto it = entries_.find(sha256);
  if (it == entries_.end()) return;
  lru_.splice(lru_.begin(), lru_, it->second.lru);
}

void ChunkCache::evictLocked(const std::string& keep) {
  auto victim = lru_.end();
  while (bytes_ > capacity_ && !lru_.empty()) {
    victim = std::prev(lru_.end());
    if (*victim == keep) {
      if (lru_.size() == 1) break;
      victim = std::prev(victim);
    }
    auto it = entries_.find(*victim);
    ::unlink(pathOf(*victim).c_str());
    bytes_ -= it->second.bytes;
    ++stats_.evictions;
    entries_.erase(it);
    lru_.erase(victim);
  }
}

void ChunkCache::report(const std::string& sha256, const std::string& what) {
  DSEC_LOG(kWarn, kLog) << "chunk " << sha256.substr(0, 12) << ": " << what;
  if (on_failure_) on_failure_(sha256, what);
}

bool ChunkCache::contains(const std::string& sha256) const {
  std::lock_guard lock(mu_);
  return entries_.count(sha256) != 0;
}

ChunkCacheStats ChunkCache::stats() const {
  std::lock_guard lock(mu_);
  ChunkCacheStats s = stats_;
  s.bytes_cached = bytes_;
  s.chunks_cached = static_cast<int64_t>(entries_.size());
  return s;
}

Result<UniqueFd> ChunkCache::open(const std::string& sha256, int64_t length, bool* fetched) {
  if (!isSha256Hex(sha256)) return Error::invalid("not a chunk name: " + sha256);
  if (fetched != nullptr) *fetched = false;
  std::unique_lock lock(mu_);
  for (;;) {
    if (auto it = entries_.find(sha256); it != entries_.end()) {
      UniqueFd fd(::open(pathOf(sha256).c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
      if (fd) {
        touchLocked(sha256);
        ++stats_.hits;
        return fd;
      }
      // Removed behind the cache's back: forget it and fetch it again.
      bytes_ -= it->second.bytes;
      lru_.erase(it->second.lru);
      entries_.erase(it);
    }
    if (in_flight_.count(sha256) == 0) break;
    fetched_.wait(lock);  // another reader fetches it: one fetch per chunk
  }
  // Put there by another process of the node (only root writes this directory, and only checked chunks).
  if (UniqueFd fd(::open(pathOf(sha256).c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW)); fd) {
    struct stat st {};
    if (::fstat(fd.get(), &st) == 0 && S_ISREG(st.st_mode) && st.st_size == length) {
      lru_.push_front(sha256);
      entries_[sha256] = Entry{length, lru_.begin()};
      bytes_ += length;
      ++stats_.hits;
      evictLocked(sha256);
      return fd;
    }
  }
  in_flight_[sha256] = 1;
  lock.unlock();
  auto fd = fetchAndInsert(sha256, length);
  lock.lock();
  in_flight_.erase(sha256);
  fetched_.notify_all();
  if (fd.ok() && fetched != nullptr) *fetched = true;
  return fd;
}

Result<UniqueFd> ChunkCache::fetchAndInsert(const std::string& sha256, int64_t length) {
  auto bytes = source_->fetch(sha256, length);
  if (!bytes.ok()) {
    {
      std::lock_guard lock(mu_);
      ++stats_.fetch_errors;
    }
    report(sha256, bytes.error().message());
    return eio(bytes.error().message());
  }
  if (static_cast<int64_t>(bytes->size()) != length || sha256Hex(*bytes) != sha256) {
    {
      std::lock_guard lock(mu_);
      ++stats_.corrupt;
    }
    std::string what = "corrupt in the store (" + std::to_string(bytes->size()) + " bytes, want " +
                       std::to_string(length) + ", or its sha256 differs)";
    report(sha256, what);
    return eio("chunk " + sha256.substr(0, 12) + " is " + what);
  }
  const std::string path = pathOf(sha256);
  DSEC_TRY(makeDirs(path.substr(0, path.rfind('/')), 0700));
  const std::string tmp = path + ".tmp." + randomHex(6);
  {
    UniqueFd out(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (!out) return Error::sys(errno, "create " + tmp);
    if (auto st = writeAll(out.get(), *bytes, tmp); !st.ok()) {
      ::unlink(tmp.c_str());
      return st.error();
    }
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return Error::sys(err, "rename " + tmp);
  }
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd) return Error::sys(errno, "open " + path);
  std::lock_guard lock(mu_);
  ++stats_.misses;
  stats_.bytes_fetched += length;
  lru_.push_front(sha256);
  entries_[sha256] = Entry{length, lru_.begin()};
  bytes_ += length;
  evictLocked(sha256);
  return fd;
}

Result<size_t> ChunkCache::read(const std::string& sha256, int64_t length, int64_t offset, char* out, size_t size) {
  if (offset < 0 || offset > length) return Error::invalid("read past the chunk");
  size = static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(size), length - offset));
  DSEC_ASSIGN_OR_RETURN(UniqueFd fd, open(sha256, length));
  size_t got = 0;
  while (got < size) {
    ssize_t n = ::pread(fd.get(), out + got, size - got, static_cast<off_t>(offset) + static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Error::sys(errno, "read cached chunk " + sha256.substr(0, 12));
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  return got;
}

}  // namespace dsec::fs3
