// File requests, resolved inside the sandbox root (openat2 RESOLVE_IN_ROOT: a symlink cannot lead out of it).
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "GuestAgent.h"

namespace dsec::guest {
namespace {

struct Fd {
  int fd = -1;
  explicit Fd(int f = -1) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) close(fd);
  }
};

int rootFd() {
  std::lock_guard lock(sandbox().mu);
  return sandbox().ready ? sandbox().root_fd : -1;
}

int openInRoot(const std::string& path, int flags, mode_t mode = 0) {
  int root = rootFd();
  if (root < 0) {
    errno = ENODEV;
    return -1;
  }
  open_how how{};
  how.flags = static_cast<uint64_t>(flags | O_CLOEXEC);
  how.mode = (flags & O_CREAT) ? mode : 0;
  how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;
  std::string rel = path;
  while (!rel.empty() && rel[0] == '/') rel.erase(0, 1);
  if (rel.empty()) rel = ".";
  return static_cast<int>(syscall(SYS_openat2, root, rel.c_str(), &how, sizeof how));
}

// "/a/b/c/" -> ("/a/b", "c"); "/" -> ("/", "").
void splitPath(std::string path, std::string* parent, std::string* name) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) {
    *parent = "/";
    *name = path;
  } else {
    *parent = slash == 0 ? "/" : path.substr(0, slash);
    *name = path.substr(slash + 1);
  }
  if (*name == "." || *name == "..") name->clear();
}

proto::StatEntry entryOf(const std::string& name, const struct stat& st) {
  proto::StatEntry e;
  e.name = name;
  e.type = S_ISREG(st.st_mode)   ? proto::EntryType::kFile
           : S_ISDIR(st.st_mode) ? proto::EntryType::kDir
           : S_ISLNK(st.st_mode) ? proto::EntryType::kSymlink
                                 : proto::EntryType::kOther;
  e.size = st.st_size;
  e.mode = st.st_mode & 07777;
  e.mtime = st.st_mtim.tv_sec;
  return e;
}

bool decodePath(Port& port, const proto::Frame& frame, proto::PathMsg* msg) {
  if (msg->decode(frame.payload)) return true;
  port.sendError(frame.request, EINVAL, "malformed path request");
  return false;
}

// Creates the directories above path (like mkdir -p), each resolved inside the root.
int makeParents(const std::string& path) {
  std::string parent, name;
  splitPath(path, &parent, &name);
  size_t pos = 0;
  while (pos < parent.size()) {
    size_t next = parent.find('/', pos + 1);
    if (next == std::string::npos) next = parent.size();
    std::string prefix = parent.substr(0, next);
    Fd dir(openInRoot(prefix, O_PATH | O_DIRECTORY));
    if (dir.fd < 0) {
      if (errno != ENOENT) return errno;
      std::string up, leaf;
      splitPath(prefix, &up, &leaf);
      Fd updir(openInRoot(up, O_PATH | O_DIRECTORY));
      if (updir.fd < 0) return errno;
      if (leaf.empty() || (mkdirat(updir.fd, leaf.c_str(), 0755) != 0 && errno != EEXIST))
        return errno ? errno : EINVAL;
    }
    pos = next;
  }
  return 0;
}

int removeTree(int parent_fd, const char* name, dev_t dev) {
  if (unlinkat(parent_fd, name, 0) == 0) return 0;
  if (errno != EISDIR && errno != EPERM) return errno;
  Fd dir(openat(parent_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (dir.fd < 0) return errno;
  struct stat st {};
  if (fstat(dir.fd, &st) != 0) return errno;
  if (st.st_dev != dev) return EBUSY;  // a mount point inside the sandbox (its /proc, /dev): left alone
  int dupfd = dup(dir.fd);
  DIR* d = fdopendir(dupfd);
  if (d == nullptr) {
    close(dupfd);
    return errno;
  }
  int first_error = 0;
  while (dirent* e = readdir(d)) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    int err = removeTree(dir.fd, e->d_name, dev);
    if (err != 0 && first_error == 0) first_error = err;
  }
  closedir(d);
  if (first_error != 0) return first_error;
  return unlinkat(parent_fd, name, AT_REMOVEDIR) == 0 ? 0 : errno;
}

}  // namespace

void handleReadFile(Port& port, const proto::Frame& frame) {
  proto::PathMsg msg;
  if (!decodePath(port, frame, &msg)) return;
  Fd fd(openInRoot(msg.path, O_RDONLY | O_NOCTTY | O_NONBLOCK));
  if (fd.fd < 0) {
    port.sendError(frame.request, errno, msg.path + ": " + strerror(errno));
    return;
  }
  struct stat st {};
  if (fstat(fd.fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    port.sendError(frame.request, S_ISDIR(st.st_mode) ? EISDIR : EINVAL, msg.path + ": not a regular file");
    return;
  }
  char buf[proto::kMaxChunk];
  for (;;) {
    ssize_t n = ::read(fd.fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      port.sendError(frame.request, errno, msg.path + ": " + strerror(errno));
      return;
    }
    if (n == 0) break;
    if (!port.send(proto::FrameType::kData, frame.request, std::string_view(buf, static_cast<size_t>(n)))) return;
  }
  port.send(proto::FrameType::kDataEof, frame.request, {});
}

void handleWriteFile(Port& port, const proto::Frame& frame, std::optional<proto::Frame>* pending) {
  proto::PathMsg msg;
  if (!decodePath(port, frame, &msg)) return;
  int err = makeParents(msg.path);
  Fd fd(err == 0 ? openInRoot(msg.path, O_WRONLY | O_CREAT | O_TRUNC | O_NOCTTY, msg.mode) : -1);
  if (err == 0 && fd.fd < 0) err = errno;
  if (err == 0 && fchmod(fd.fd, msg.mode) != 0) err = errno;
  if (err != 0) {
    port.sendError(frame.request, err, msg.path + ": " + strerror(err));
    return;
  }
  if (!port.send(proto::FrameType::kOk, frame.request, {})) return;
  // The data follows; a write error is answered at the end, so the stream stays in step.
  for (;;) {
    proto::Frame f;
    Port::Read r = port.read(&f, -1);
    if (r == Port::Read::kHangup || r == Port::Read::kBad) return;
    if (r != Port::Read::kFrame) continue;
    if (f.type == proto::FrameType::kHello) {
      *pending = std::move(f);
      return;
    }
    if (f.request != frame.request) continue;
    if (f.type == proto::FrameType::kData) {
      size_t done = 0;
      while (err == 0 && done < f.payload.size()) {
        ssize_t n = ::write(fd.fd, f.payload.data() + done, f.payload.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
          err = n < 0 ? errno : EIO;
          break;
        }
        done += static_cast<size_t>(n);
      }
    } else if (f.type == proto::FrameType::kDataEof) {
      if (err == 0) {
        port.send(proto::FrameType::kOk, frame.request, {});
      } else {
        port.sendError(frame.request, err, msg.path + ": " + strerror(err));
      }
      return;
    }
  }
}

void handleStat(Port& port, const proto::Frame& frame) {
  proto::PathMsg msg;
  if (!decodePath(port, frame, &msg)) return;
  std::string parent, name;
  splitPath(msg.path, &parent, &name);
  struct stat st {};
  int rc;
  if (name.empty()) {
    Fd fd(openInRoot(msg.path, O_PATH));
    rc = fd.fd < 0 ? -1 : fstat(fd.fd, &st);
  } else {
    Fd dir(openInRoot(parent, O_PATH | O_DIRECTORY));
    rc = dir.fd < 0 ? -1 : fstatat(dir.fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW);
  }
  if (rc != 0) {
    port.sendError(frame.request, errno, msg.path + ": " + strerror(errno));
    return;
  }
  port.send(proto::FrameType::kStatReply, frame.request, entryOf(name.empty() ? "/" : name, st).encode());
}

void handleListDir(Port& port, const proto::Frame& frame) {
  proto::PathMsg msg;
  if (!decodePath(port, frame, &msg)) return;
  Fd dirfd(openInRoot(msg.path, O_RDONLY | O_DIRECTORY));
  if (dirfd.fd < 0) {
    port.sendError(frame.request, errno, msg.path + ": " + strerror(errno));
    return;
  }
  int dupfd = dup(dirfd.fd);
  DIR* d = fdopendir(dupfd);
  if (d == nullptr) {
    close(dupfd);
    port.sendError(frame.request, errno, msg.path + ": " + strerror(errno));
    return;
  }
  proto::DirEntriesMsg batch;
  size_t bytes = 0;
  bool ok = true;
  while (dirent* e = readdir(d)) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    struct stat st {};
    if (fstatat(dirfd.fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;  // removed meanwhile
    batch.entries.push_back(entryOf(e->d_name, st));
    bytes += strlen(e->d_name) + 32;
    if (batch.entries.size() >= 1024 || bytes > proto::kMaxPayload / 2) {
      ok = port.send(proto::FrameType::kDirEntries, frame.request, batch.encode());
      batch.entries.clear();
      bytes = 0;
      if (!ok) break;
    }
  }
  closedir(d);
  if (!ok) return;
  if (!batch.entries.empty() && !port.send(proto::FrameType::kDirEntries, frame.request, batch.encode())) return;
  port.send(proto::FrameType::kOk, frame.request, {});
}

void handleRemove(Port& port, const proto::Frame& frame) {
  proto::PathMsg msg;
  if (!decodePath(port, frame, &msg)) return;
  std::string parent, name;
  splitPath(msg.path, &parent, &name);
  if (name.empty()) {
    port.sendError(frame.request, EBUSY, msg.path + ": cannot remove the root");
    return;
  }
  Fd dir(openInRoot(parent, O_PATH | O_DIRECTORY));
  int err = 0;
  if (dir.fd < 0) {
    err = errno;
  } else if (msg.recursive) {
    struct stat st {};
    err = fstat(dir.fd, &st) != 0 ? errno : removeTree(dir.fd, name.c_str(), st.st_dev);
  } else if (unlinkat(dir.fd, name.c_str(), 0) != 0) {
    err = errno;
    if ((err == EISDIR || err == EPERM) && unlinkat(dir.fd, name.c_str(), AT_REMOVEDIR) == 0)
      err = 0;
    else if (err == EISDIR || err == EPERM)
      err = errno;
  }
  if (err != 0) {
    port.sendError(frame.request, err, msg.path + ": " + strerror(err));
    return;
  }
  port.send(proto::FrameType::kOk, frame.request, {});
}

}  // namespace dsec::guest
