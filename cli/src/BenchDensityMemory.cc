#include "BenchDensityMemory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <vector>

#include "dsec/common/Directory.h"
#include "dsec/common/Pressure.h"
#include "dsec/common/Strings.h"
#include "dsec/fs3/LayerRef.h"
#include "dsec/launcher/node/NodeAgent.h"

namespace dsec::cli {
namespace {

// Bytes of a file resident in the page cache (mincore over a shared read-only mapping: counts each page once,
// whoever faulted it in).
int64_t residentBytes(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  struct stat st {};
  int64_t resident = 0;
  if (::fstat(fd, &st) == 0 && st.st_size > 0) {
    void* map = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
    if (map != MAP_FAILED) {
      long page = sysconf(_SC_PAGESIZE);
      size_t pages = (static_cast<size_t>(st.st_size) + page - 1) / page;
      std::vector<unsigned char> vec(pages);
      if (::mincore(map, static_cast<size_t>(st.st_size), vec.data()) == 0) {
        for (unsigned char v : vec) resident += (v & 1) ? page : 0;
      }
      ::munmap(map, static_cast<size_t>(st.st_size));
    }
  }
  ::close(fd);
  return resident;
}

}  // namespace

int64_t imageResidentBytes(const std::string& root, const std::string& image) {
  auto layers = fs3::parseImageRef(image);
  if (!layers.ok()) return 0;
  int64_t total = 0;
  for (const auto& l : *layers) total += residentBytes(root + "/layers/" + l.name + "/" + l.version + "/layer.erofs");
  return total;
}

ProcessMemory sandboxProcessMemory(const std::string& parent) {
  ProcessMemory m;
  PressurePaths paths = resolvePressurePaths(parent);
  auto sandboxes = listDirectory(paths.memory_dir);
  if (!sandboxes.ok()) return m;
  for (const auto& ent : *sandboxes) {
    if (ent.name[0] == '.' || !ent.is_dir) continue;
    auto procs = readFile(paths.memory_dir + "/" + ent.name + "/cgroup.procs");
    if (!procs.ok()) continue;
    for (const auto& pid : split(*procs, '\n')) {
      if (pid.empty()) continue;
      auto rollup = readFile("/proc/" + pid + "/smaps_rollup");
      if (!rollup.ok()) continue;
      std::map<std::string, double> kv;
      for (const auto& line : split(*rollup, '\n')) {
        auto f = split(line, ':');
        if (f.size() != 2) continue;
        kv[f[0]] = std::atof(trim(f[1]).c_str()) * 1024;
      }
      auto status = readFile("/proc/" + pid + "/status");
      if (status.ok()) {
        for (const auto& line : split(*status, '\n')) {
          auto f = split(line, ':');
          if (f.size() == 2 && (f[0] == "RssFile" || f[0] == "RssAnon"))
            kv[f[0]] = std::atof(trim(f[1]).c_str()) * 1024;
        }
      }
      m.rss_file += kv["RssFile"];
      m.rss_anon += kv["RssAnon"];
      m.pss_file += kv["Pss_File"];
      m.pss_anon += kv["Pss_Anon"];
      ++m.processes;
    }
  }
  return m;
}

std::string limitParent(const std::string& root, int64_t bytes) {
  std::string parent = launcher::cgroupParentForRoot(root);
  PressurePaths paths = resolvePressurePaths(parent);
  if (paths.cgroup_version == 0) return "";
  ::mkdir(paths.memory_dir.c_str(), 0755);
  std::string file = paths.memory_dir + (paths.cgroup_version == 2 ? "/memory.max" : "/memory.limit_in_bytes");
  if (!writeFile(file, std::to_string(bytes)).ok()) return "";
  return paths.memory_dir;
}

}  // namespace dsec::cli
