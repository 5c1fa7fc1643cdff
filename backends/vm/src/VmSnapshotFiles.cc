#include "VmSnapshotFiles.h"

#include <fcntl.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <vector>

#include "dsec/common/Fd.h"
#include "dsec/common/Strings.h"

namespace dsec::backends::vm {
namespace {

constexpr double kMigrationTimeout = 300;
constexpr int64_t kMaxMemoryBytes = 1ll << 40;

}  // namespace

Result<VmSnapshotInfo> readSnapshotInfo(const std::string& dir) {
  DSEC_ASSIGN_OR_RETURN(std::string text, readFile(dir + "/" + kSnapshotInfoFile));
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Error::invalid(dir + ": vm.json is not a JSON object");
  VmSnapshotInfo info;
  try {
    info.kind = j.at("kind").get<std::string>();
    info.memory_bytes = j.at("memory_bytes").get<int64_t>();
    info.cpus = j.at("cpus").get<int>();
    info.layers = j.at("layers").get<int>();
    info.ram_file = j.at("ram_file").get<bool>();
    info.kernel_release = j.value("kernel_release", "");
  } catch (const nlohmann::json::exception& e) {
    return Error::invalid(dir + ": vm.json: " + e.what());
  }
  if (info.memory_bytes <= 0 || info.memory_bytes > kMaxMemoryBytes || info.cpus < 1 || info.cpus > 64 ||
      info.layers < 1 || info.layers > 64) {
    return Error::invalid(dir + ": vm.json has impossible values");
  }
  return info;
}

Status writeSnapshotInfo(const std::string& dir, const VmSnapshotInfo& info) {
  nlohmann::json j{
      {"format", 1},           {"kind", info.kind},         {"memory_bytes", info.memory_bytes},    {"cpus", info.cpus},
      {"layers", info.layers}, {"ram_file", info.ram_file}, {"kernel_release", info.kernel_release}};
  return writeFileAtomic(dir + "/" + kSnapshotInfoFile, j.dump(2) + "\n", 0600);
}

Result<int64_t> copySparse(const std::string& src, const std::string& dst) {
  UniqueFd in(::open(src.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!in) return Error::sys(errno, "open " + src);
  UniqueFd out(::open(dst.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!out) return Error::sys(errno, "create " + dst);
  off_t size = ::lseek(in.get(), 0, SEEK_END);
  if (size < 0) return Error::sys(errno, "size of " + src);
  if (::ftruncate(out.get(), size) != 0) return Error::sys(errno, "size " + dst);
  std::vector<char> buf(1 << 20);
  int64_t copied = 0;
  off_t pos = 0;
  while (pos < size) {
    off_t data = ::lseek(in.get(), pos, SEEK_DATA);
    if (data < 0) break;  // ENXIO: no data past pos
    off_t hole = ::lseek(in.get(), data, SEEK_HOLE);
    if (hole < 0) hole = size;
    for (off_t at = data; at < hole;) {
      size_t want = static_cast<size_t>(std::min<off_t>(hole - at, static_cast<off_t>(buf.size())));
      ssize_t r = ::pread(in.get(), buf.data(), want, at);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return Error::sys(r < 0 ? errno : EIO, "read " + src);
      // All-zero blocks stay holes: a guest's freed-and-zeroed pages cost nothing in the snapshot.
      bool zero = true;
      for (ssize_t i = 0; i < r && zero; ++i) zero = buf[static_cast<size_t>(i)] == 0;
      if (!zero) {
        for (ssize_t done = 0; done < r;) {
          ssize_t w = ::pwrite(out.get(), buf.data() + done, static_cast<size_t>(r - done), at + done);
          if (w < 0 && errno == EINTR) continue;
          if (w < 0) return Error::sys(errno, "write " + dst);
          done += w;
        }
        copied += r;
      }
      at += r;
    }
    pos = hole;
  }
  if (::fsync(out.get()) != 0) return Error::sys(errno, "fsync " + dst);
  return copied;
}

Status loadState(QmpClient& qmp, const std::string& dir) {
  const std::string path = dir + "/" + kSnapshotStateFile;
  UniqueFd state(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!state) return Error::sys(errno, "open " + path);
  DSEC_TRY(qmp.execute("migrate-set-capabilities",
                       {{"capabilities", {{{"capability", "x-ignore-shared"}, {"state", true}}}}}));
  DSEC_TRY(qmp.sendFd("snapshot", state.get()));
  DSEC_TRY(qmp.execute("migrate-incoming", {{"uri", "fd:snapshot"}}));
  DSEC_TRY(qmp.waitMigration(kMigrationTimeout));
  DSEC_ASSIGN_OR_RETURN(auto status, qmp.execute("query-status"));
  if (!status.is_object() || !status.value("running", false)) DSEC_TRY(qmp.execute("cont"));
  return okStatus();
}

}  // namespace dsec::backends::vm
