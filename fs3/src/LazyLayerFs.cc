#define FUSE_USE_VERSION 34
#include "dsec/fs3/LazyLayerFs.h"

#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <poll.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "dsec/common/Logging.h"
#include "dsec/common/Strings.h"

namespace dsec::fs3 {
namespace {

constexpr const char* kLog = "fs3";
constexpr double kForever = 86400;  // layers never change: the kernel may cache names and sizes for a day
constexpr fuse_ino_t kRootIno = 1;

LazyLayerFs* self(fuse_req_t req) { return static_cast<LazyLayerFs*>(fuse_req_userdata(req)); }

struct stat fileStat(const LazyLayerFs::File& f) {
  struct stat st {};
  st.st_ino = f.ino;
  st.st_mode = S_IFREG | 0444;
  st.st_nlink = 1;
  st.st_size = f.layer.layer.size;
  st.st_blksize = static_cast<blksize_t>(f.layer.chunk_size);
  st.st_blocks = (f.layer.layer.size + 511) / 512;
  return st;
}

struct stat rootStat() {
  struct stat st {};
  st.st_ino = kRootIno;
  st.st_mode = S_IFDIR | 0555;
  st.st_nlink = 2;
  return st;
}

// Every callback replies exactly once, and no exception leaves it (they are called from C).
template <typename Fn>
void guarded(fuse_req_t req, Fn&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    DSEC_LOG(kError, kLog) << "lazy layer request failed: " << e.what();
    fuse_reply_err(req, EIO);
  } catch (...) {
    fuse_reply_err(req, EIO);
  }
}

void onLookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  guarded(req, [&] {
    auto f = parent == kRootIno ? self(req)->fileByName(name) : nullptr;
    if (!f) {
      fuse_reply_err(req, ENOENT);
      return;
    }
    fuse_entry_param e{};
    e.ino = f->ino;
    e.attr = fileStat(*f);
    e.attr_timeout = kForever;
    e.entry_timeout = kForever;
    fuse_reply_entry(req, &e);
  });
}

void onGetattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info* /*fi*/) {
  guarded(req, [&] {
    if (ino == kRootIno) {
      struct stat st = rootStat();
      fuse_reply_attr(req, &st, 1.0);  // the root's listing changes as layers are attached
      return;
    }
    auto f = self(req)->fileByIno(ino);
    if (!f) {
      fuse_reply_err(req, ENOENT);
      return;
    }
    struct stat st = fileStat(*f);
    fuse_reply_attr(req, &st, kForever);
  });
}

void onReaddir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* /*fi*/) {
  guarded(req, [&] {
    if (ino != kRootIno) {
      fuse_reply_err(req, ENOTDIR);
      return;
    }
    std::vector<std::pair<std::string, struct stat>> entries = {{".", rootStat()}, {"..", rootStat()}};
    for (const auto& f : self(req)->files()) entries.emplace_back(f->name, fileStat(*f));
    std::string buf(size, '\0');
    size_t used = 0;
    for (size_t i = static_cast<size_t>(std::max<off_t>(off, 0)); i < entries.size(); ++i) {
      size_t need = fuse_add_direntry(req, buf.data() + used, size - used, entries[i].first.c_str(), &entries[i].second,
                                      static_cast<off_t>(i + 1));
      if (need > size - used) break;
      used += need;
    }
    fuse_reply_buf(req, buf.data(), used);
  });
}

void onOpen(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  guarded(req, [&] {
    if (ino == kRootIno) {
      fuse_reply_err(req, EISDIR);
      return;
    }
    if (!self(req)->fileByIno(ino)) {
      fuse_reply_err(req, ENOENT);
      return;
    }
    if ((fi->flags & O_ACCMODE) != O_RDONLY) {
      fuse_reply_err(req, EROFS);
      return;
    }
    fi->keep_cache = 1;  // the bytes never change: keep them in the page cache across opens
    fuse_reply_open(req, fi);
  });
}

void onRead(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* /*fi*/) {
  guarded(req, [&] {
    auto f = self(req)->fileByIno(ino);
    if (!f) {
      fuse_reply_err(req, ENOENT);
      return;
    }
    std::string buf(size, '\0');
    auto n = self(req)->readAt(*f, off, buf.data(), size);
    if (!n.ok()) {
      fuse_reply_err(req, n.error().sysErrno() != 0 ? n.error().sysErrno() : EIO);
      return;
    }
    fuse_reply_buf(req, buf.data(), *n);
  });
}

void onStatfs(fuse_req_t req, fuse_ino_t /*ino*/) {
  guarded(req, [&] {
    struct statvfs st {};
    st.f_bsize = 4096;
    st.f_namemax = 255;
    fuse_reply_statfs(req, &st);
  });
}

constexpr int kWorkers = 4;
constexpr int kPollMs = 200;

void serveRequests(fuse_session* session) {
  fuse_buf buf{};
  const int fd = fuse_session_fd(session);
  while (fuse_session_exited(session) == 0) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, kPollMs) <= 0) continue;
    int n = fuse_session_receive_buf(session, &buf);
    if (n == -EINTR || n == -EAGAIN) continue;  // another worker took it
    if (n <= 0) break;                          // unmounted, or the connection is gone
    fuse_session_process_buf(session, &buf);
  }
  ::free(buf.mem);  // NOLINT(cppcoreguidelines-no-malloc): libfuse allocated it
}

// /sys/fs/fuse/connections/<minor>/abort (mounting fusectl there first when the host has not).
void abortConnection(unsigned int minor_dev) {
  const std::string dir = "/sys/fs/fuse/connections";
  std::string abort = dir + "/" + std::to_string(minor_dev) + "/abort";
  if (::access(abort.c_str(), W_OK) != 0) (void)::mount("fusectl", dir.c_str(), "fusectl", 0, nullptr);
  if (int fd = ::open(abort.c_str(), O_WRONLY | O_CLOEXEC); fd >= 0) {
    (void)!::write(fd, "1", 1);
    ::close(fd);
  }
}

}  // namespace

std::string lazyFileName(const LayerRef& ref) { return ref.name + "@" + ref.version + ".erofs"; }

LazyLayerFs::LazyLayerFs(std::string mountpoint, std::shared_ptr<ChunkCache> cache)
    : mountpoint_(std::move(mountpoint)), cache_(std::move(cache)) {}

Result<std::unique_ptr<LazyLayerFs>> LazyLayerFs::mount(const std::string& mountpoint,
                                                        std::shared_ptr<ChunkCache> cache) {
  if (::access("/dev/fuse", R_OK | W_OK) != 0) {
    return Error(ErrorCode::kUnsupported, "on-demand layers need FUSE: /dev/fuse: " + std::string(strerror(errno)));
  }
  DSEC_TRY(makeDirs(mountpoint, 0755));
  std::unique_ptr<LazyLayerFs> fs(new LazyLayerFs(mountpoint, std::move(cache)));
  static const fuse_lowlevel_ops ops = [] {
    fuse_lowlevel_ops o{};
    o.lookup = onLookup;
    o.getattr = onGetattr;
    o.readdir = onReaddir;
    o.open = onOpen;
    o.read = onRead;
    o.statfs = onStatfs;
    return o;
  }();
  // Only root (the node) reads the files: the EROFS mounts and QEMU open them before dropping privileges.
  const char* argv[] = {"dsec-lazy-layers", "-o", "ro,default_permissions,fsname=dsec-lazy,subtype=dsec-lazy"};
  fuse_args args = FUSE_ARGS_INIT(3, const_cast<char**>(argv));
  fs->session_ = fuse_session_new(&args, &ops, sizeof ops, fs.get());
  if (fs->session_ == nullptr) return Error(ErrorCode::kSystem, "fuse_session_new failed (see the log)");
  if (fuse_session_mount(fs->session_, mountpoint.c_str()) != 0) {
    fuse_session_destroy(fs->session_);
    fs->session_ = nullptr;
    return Error(ErrorCode::kUnsupported, "mounting the FUSE file system of on-demand layers at " + mountpoint +
                                              " failed (is the fuse module loaded?)");
  }
  // Our own workers rather than libfuse's loop: they poll a non-blocking fd and see the session's exit within
  // kPollMs, whatever the kernel side does (a layer still mounted over a file keeps the connection open).
  int fd = fuse_session_fd(fs->session_);
  if (int flags = ::fcntl(fd, F_GETFL); flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    return Error::sys(errno, "make the FUSE fd non-blocking");
  }
  for (int i = 0; i < kWorkers; ++i) fs->workers_.emplace_back(serveRequests, fs->session_);
  return fs;
}

LazyLayerFs::~LazyLayerFs() {
  if (session_ == nullptr) return;
  struct stat st {};
  const bool have_dev = ::stat(mountpoint_.c_str(), &st) == 0;
  fuse_session_exit(session_);
  for (auto& w : workers_) w.join();
  fuse_session_unmount(session_);
  // A layer still mounted over one of the files keeps the connection open after the (detached) unmount, and its
  // readers would wait for answers that never come: abort the connection, so they get an error instead.
  if (have_dev) abortConnection(minor(st.st_dev));
  fuse_session_destroy(session_);
  ::rmdir(mountpoint_.c_str());
}

Result<std::string> LazyLayerFs::attach(const StoredLayer& layer) {
  std::lock_guard lock(mu_);
  std::string name = lazyFileName(layer.layer.ref);
  if (auto it = by_name_.find(name); it != by_name_.end()) {
    if (it->second->layer.layer.sha256 != layer.layer.sha256) {
      return Error(ErrorCode::kConflict, "layer " + layer.layer.ref.toString() + " changed in the store");
    }
    return mountpoint_ + "/" + name;
  }
  auto f = std::make_shared<File>();
  f->ino = next_ino_++;
  f->name = name;
  f->layer = layer;
  f->seen.assign(layer.chunks.size(), false);
  by_ino_[f->ino] = f;
  by_name_[name] = f;
  return mountpoint_ + "/" + name;
}

std::string LazyLayerFs::filePath(const LayerRef& ref) const {
  std::lock_guard lock(mu_);
  std::string name = lazyFileName(ref);
  return by_name_.count(name) != 0 ? mountpoint_ + "/" + name : "";
}

std::vector<size_t> LazyLayerFs::touchedChunks(const LayerRef& ref) const {
  std::lock_guard lock(mu_);
  auto it = by_name_.find(lazyFileName(ref));
  return it == by_name_.end() ? std::vector<size_t>{} : it->second->touched;
}

std::shared_ptr<LazyLayerFs::File> LazyLayerFs::fileByIno(uint64_t ino) const {
  std::lock_guard lock(mu_);
  auto it = by_ino_.find(ino);
  return it == by_ino_.end() ? nullptr : it->second;
}

std::shared_ptr<LazyLayerFs::File> LazyLayerFs::fileByName(const std::string& name) const {
  std::lock_guard lock(mu_);
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

std::vector<std::shared_ptr<LazyLayerFs::File>> LazyLayerFs::files() const {
  std::lock_guard lock(mu_);
  std::vector<std::shared_ptr<File>> out;
  for (const auto& [ino, f] : by_ino_) out.push_back(f);
  return out;
}

void LazyLayerFs::recordTouch(File& file, size_t chunk) {
  std::lock_guard lock(mu_);
  if (chunk < file.seen.size() && !file.seen[chunk]) {
    file.seen[chunk] = true;
    file.touched.push_back(chunk);
  }
}

Result<size_t> LazyLayerFs::readAt(File& file, int64_t offset, char* out, size_t size) {
  const StoredLayer& l = file.layer;
  if (offset < 0) return Error::sys(EINVAL, "negative offset");
  size_t done = 0;
  while (done < size && offset + static_cast<int64_t>(done) < l.layer.size) {
    int64_t at = offset + static_cast<int64_t>(done);
    auto index = static_cast<size_t>(at / l.chunk_size);
    int64_t within = at % l.chunk_size;
    recordTouch(file, index);
    DSEC_ASSIGN_OR_RETURN(size_t n,
                          cache_->read(l.chunks[index], l.chunkLength(index), within, out + done, size - done));
    if (n == 0) return Error(ErrorCode::kSystem, "short chunk", EIO);
    done += n;
  }
  return done;
}

}  // namespace dsec::fs3
