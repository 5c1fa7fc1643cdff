#include "dsec/common/Strings.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <ctime>

#include "dsec/common/Directory.h"
#include "dsec/common/Fd.h"
#include "dsec/common/FdIo.h"

namespace dsec {

Result<int64_t> parseByteSize(std::string_view text) {
  std::string s = trim(text);
  if (s.empty()) return Error::invalid("empty size");
  size_t i = 0;
  bool seen_digit = false;
  bool seen_dot = false;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || (s[i] == '.' && !seen_dot))) {
    if (s[i] == '.') {
      seen_dot = true;
    } else {
      seen_digit = true;
    }
    ++i;
  }
  if (!seen_digit) return Error::invalid("size '" + s + "' must start with a non-negative number (e.g. 512M)");
  double number = 0;
  try {
    number = std::stod(s.substr(0, i));
  } catch (...) {
    return Error::invalid("size '" + s + "' is not a number");
  }
  std::string suffix = s.substr(i);
  for (auto& c : suffix) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double mult = 1;
  if (suffix.empty() || suffix == "b") {
    mult = 1;
  } else if (suffix == "k" || suffix == "kb" || suffix == "kib") {
    mult = 1024.0;
  } else if (suffix == "m" || suffix == "mb" || suffix == "mib") {
    mult = 1024.0 * 1024;
  } else if (suffix == "g" || suffix == "gb" || suffix == "gib") {
    mult = 1024.0 * 1024 * 1024;
  } else if (suffix == "t" || suffix == "tb" || suffix == "tib") {
    mult = 1024.0 * 1024 * 1024 * 1024;
  } else {
    return Error::invalid("size '" + s + "' has an unknown unit '" + suffix + "' (use K, M, G or T)");
  }
  double bytes = number * mult;
  if (!std::isfinite(bytes) || bytes > 9.0e18) return Error::invalid("size '" + s + "' is too large");
  return static_cast<int64_t>(bytes);
}

std::string formatBytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

std::vector<std::string> split(std::string_view text, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t pos = text.find(sep, start);
    if (pos == std::string_view::npos) {
      out.emplace_back(text.substr(start));
      return out;
    }
    out.emplace_back(text.substr(start, pos - start));
    start = pos + 1;
  }
}

std::string trim(std::string_view text) {
  size_t b = 0;
  size_t e = text.size();
  while (b < e && std::isspace(static_cast<unsigned char>(text[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(text[e - 1]))) --e;
  return std::string(text.substr(b, e - b));
}

bool startsWith(std::string_view text, std::string_view prefix) { return text.substr(0, prefix.size()) == prefix; }

std::string hexEncode(std::string_view bytes) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

std::string percentEncode(std::string_view text, bool keep_slash) {
  static const char kDigits[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(text.size());
  for (unsigned char c : text) {
    if (std::isalnum(c) != 0 || c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/')) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kDigits[c >> 4]);
      out.push_back(kDigits[c & 15]);
    }
  }
  return out;
}

std::string rfc3339(double unix_seconds) {
  const auto t = static_cast<time_t>(unix_seconds);
  struct tm tm {};
  ::gmtime_r(&t, &tm);
  char buf[32];
  ::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string randomHex(size_t length) {
  static const char kDigits[] = "0123456789abcdef";
  std::string bytes((length + 1) / 2, '\0');
  size_t got = 0;
  while (got < bytes.size()) {
    ssize_t n = getrandom(bytes.data() + got, bytes.size() - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
  }
  std::string out;
  out.reserve(length);
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  out.resize(length);
  return out;
}

namespace {

Result<std::string> readAllOf(int fd, const std::string& path) {
  std::string out;
  char buf[16384];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error::sys(errno, "read " + path);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

}  // namespace

Result<std::string> readFile(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return Error::sys(errno, "open " + path);
  return readAllOf(fd.get(), path);
}

Result<std::string> readPrivateFile(const std::string& path) {
  // The directory is opened first and the file is opened relative to that fd, so the directory that was checked is
  // the one the file came from: checking the parent by path after the open would let another user swap a
  // directory they control in and out between the two steps.
  size_t slash = path.find_last_of('/');
  std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  if (name.empty() || name == "." || name == "..") return Error(ErrorCode::kInvalidArgument, path + " names no file");
  UniqueFd dir_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir_fd) return Error::sys(errno, "open " + dir);
  struct stat parent {};
  if (::fstat(dir_fd.get(), &parent) != 0) return Error::sys(errno, "fstat " + dir);
  bool others_may_replace = (parent.st_mode & 022) != 0 && (parent.st_mode & S_ISVTX) == 0;
  if ((parent.st_uid != ::geteuid() && parent.st_uid != 0) || others_may_replace) {
    return Error(ErrorCode::kConflict, "the directory of " + path + " may be changed by another user: refused");
  }
  UniqueFd fd(::openat(dir_fd.get(), name.c_str(), O_RDONLY | O_NOFOLLOW | O_NOCTTY | O_NONBLOCK | O_CLOEXEC));
  if (!fd) {
    if (errno == ELOOP) return Error(ErrorCode::kConflict, path + " is a symbolic link: refused");
    return Error::sys(errno, "open " + path);
  }
  struct stat file {};
  if (::fstat(fd.get(), &file) != 0) return Error::sys(errno, "fstat " + path);
  if (!S_ISREG(file.st_mode) || file.st_uid != ::geteuid() || (file.st_mode & 077) != 0) {
    return Error(ErrorCode::kConflict, path + " must be a regular file of uid " + std::to_string(::geteuid()) +
                                           " that no one else may read or write (mode 0600)");
  }
  return readAllOf(fd.get(), path);
}

Status makePrivateDir(const std::string& path) {
  DSEC_TRY(makeDirs(path, 0700));
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd) {
    if (errno == ELOOP || errno == ENOTDIR) return Error(ErrorCode::kConflict, path + " is not a directory: refused");
    return Error::sys(errno, "open " + path);
  }
  struct stat dir {};
  if (::fstat(fd.get(), &dir) != 0) return Error::sys(errno, "fstat " + path);
  if (dir.st_uid != ::geteuid()) {
    return Error(ErrorCode::kConflict, path + " belongs to uid " + std::to_string(dir.st_uid) + ", not to uid " +
                                           std::to_string(::geteuid()) + ": refused");
  }
  if ((dir.st_mode & 077) != 0 && ::fchmod(fd.get(), 0700) != 0) return Error::sys(errno, "chmod 0700 " + path);
  return {};
}

Status writeFile(const std::string& path, std::string_view contents) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd) return Error::sys(errno, "open " + path);
  return writeAll(fd.get(), contents, path);
}

Status writeFileAtomic(const std::string& path, std::string_view contents, int mode, Durability durability) {
  std::string tmp = path + ".tmp-" + randomHex(8);
  {
    UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode));
    if (!fd) return Error::sys(errno, "open " + tmp);
    Status st = writeAll(fd.get(), contents, tmp);
    if (st.ok() && durability == Durability::kSurvivesPowerLoss && ::fsync(fd.get()) != 0) {
      st = Error::sys(errno, "fsync " + tmp);
    }
    if (!st.ok()) {
      ::unlink(tmp.c_str());
      return st;
    }
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return Error::sys(err, "rename " + tmp + " to " + path);
  }
  return okStatus();
}

Status makeDirs(const std::string& path, int mode) {
  if (path.empty()) return Error::invalid("empty directory path");
  std::string cur;
  for (const auto& part : split(path, '/')) {
    if (part.empty()) {
      if (cur.empty()) cur = "/";
      continue;
    }
    if (!cur.empty() && cur.back() != '/') cur += '/';
    cur += part;
    if (::mkdir(cur.c_str(), mode) != 0 && errno != EEXIST) return Error::sys(errno, "mkdir " + cur);
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return Error::sys(errno, "stat " + path);
  if (!S_ISDIR(st.st_mode)) return Error(ErrorCode::kInvalidArgument, path + " exists and is not a directory");
  return okStatus();
}

// Removes the entries of dirfd (which lives on device dev) recursively without following symlinks or
// crossing into other mounts.
static Status removeContents(int dirfd, dev_t dev, const std::string& path) {
  DSEC_ASSIGN_OR_RETURN(auto entries, listDirectoryAt(dirfd, path));
  Status result;
  for (const auto& ent : entries) {
    const std::string& name = ent.name;
    struct stat st {};
    if (::fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (S_ISDIR(st.st_mode)) {
      if (st.st_dev != dev) {
        result = Error(ErrorCode::kConflict, "refusing to remove " + path + "/" + name + ": it is a mount point");
        continue;
      }
      UniqueFd child(::openat(dirfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (!child) continue;
      Status st2 = removeContents(child.get(), dev, path + "/" + name);
      if (!st2.ok()) result = st2;
      if (::unlinkat(dirfd, name.c_str(), AT_REMOVEDIR) != 0 && result.ok()) {
        result = Error::sys(errno, "rmdir " + path + "/" + name);
      }
    } else if (::unlinkat(dirfd, name.c_str(), 0) != 0 && result.ok()) {
      result = Error::sys(errno, "unlink " + path + "/" + name);
    }
  }
  return result;
}

Status removeTree(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return okStatus();
    return Error::sys(errno, "stat " + path);
  }
  if (!S_ISDIR(st.st_mode)) {
    if (::unlink(path.c_str()) != 0) return Error::sys(errno, "unlink " + path);
    return okStatus();
  }
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd) return Error::sys(errno, "open " + path);
  DSEC_TRY(removeContents(fd.get(), st.st_dev, path));
  if (::rmdir(path.c_str()) != 0) return Error::sys(errno, "rmdir " + path);
  return okStatus();
}

double monotonicSeconds() {
  struct timespec ts {};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

}  // namespace dsec
