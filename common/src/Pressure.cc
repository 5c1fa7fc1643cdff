#include "dsec/common/Pressure.h"

#include <unistd.h>

#include <charconv>
#include <cstdlib>
#include <vector>

#include "dsec/common/Strings.h"

namespace dsec {
namespace {

bool parseDouble(std::string_view s, double* out) {
  std::string copy(s);
  char* end = nullptr;
  *out = std::strtod(copy.c_str(), &end);
  return !copy.empty() && end == copy.c_str() + copy.size();
}

template <typename T>
bool parseInt(std::string_view s, T* out) {
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && ptr == s.data() + s.size();
}

std::vector<std::string_view> fields(std::string_view line) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
    size_t start = i;
    while (i < line.size() && line[i] != ' ' && line[i] != '\t') ++i;
    if (i > start) out.push_back(line.substr(start, i - start));
  }
  return out;
}

template <typename Fn>
void forEachLine(std::string_view text, Fn fn) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    fn(text.substr(pos, nl - pos));
    pos = nl + 1;
  }
}

bool exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

Result<int64_t> readInt(const std::string& path) {
  DSEC_ASSIGN_OR_RETURN(std::string text, readFile(path));
  std::string t = trim(text);
  if (t == "max") return int64_t{0};
  int64_t v = 0;
  if (!parseInt(std::string_view(t), &v)) return Error::invalid(path + ": not a number: '" + t + "'");
  return v;
}

}  // namespace

Result<Psi> parsePsi(std::string_view text) {
  Psi psi;
  bool has_some = false;
  std::optional<Error> bad;
  forEachLine(text, [&](std::string_view line) {
    auto f = fields(line);
    if (f.empty() || bad) return;
    PsiLine* target = nullptr;
    if (f[0] == "some") {
      target = &psi.some;
      has_some = true;
    } else if (f[0] == "full") {
      target = &psi.full;
      psi.has_full = true;
    } else {
      bad = Error::invalid("PSI: unexpected line '" + std::string(line) + "'");
      return;
    }
    for (size_t i = 1; i < f.size(); ++i) {
      size_t eq = f[i].find('=');
      if (eq == std::string_view::npos) {
        bad = Error::invalid("PSI: field without '=': '" + std::string(f[i]) + "'");
        return;
      }
      std::string_view key = f[i].substr(0, eq), value = f[i].substr(eq + 1);
      bool ok = true;
      if (key == "avg10") {
        ok = parseDouble(value, &target->avg10);
      } else if (key == "avg60") {
        ok = parseDouble(value, &target->avg60);
      } else if (key == "avg300") {
        ok = parseDouble(value, &target->avg300);
      } else if (key == "total") {
        ok = parseInt(value, &target->total_usec);
      }  // unknown keys: newer kernels may add some
      if (!ok) {
        bad = Error::invalid("PSI: bad value in '" + std::string(f[i]) + "'");
        return;
      }
    }
  });
  if (bad) return *bad;
  if (!has_some) return Error::invalid("PSI: no 'some' line");
  return psi;
}

Result<Psi> readPsi(const std::string& path) {
  DSEC_ASSIGN_OR_RETURN(std::string text, readFile(path));
  auto psi = parsePsi(text);
  if (!psi.ok()) return psi.error().wrap("reading " + path);
  return psi;
}

Result<MemInfo> parseMemInfo(std::string_view text) {
  MemInfo m;
  bool total = false, available = false;
  forEachLine(text, [&](std::string_view line) {
    size_t colon = line.find(':');
    if (colon == std::string_view::npos) return;
    std::string_view key = line.substr(0, colon);
    auto f = fields(line.substr(colon + 1));
    if (f.empty()) return;
    int64_t v = 0;
    if (!parseInt(f[0], &v)) return;
    if (f.size() > 1 && f[1] == "kB") v *= 1024;
    if (key == "MemTotal") {
      m.total_bytes = v;
      total = true;
    } else if (key == "MemAvailable") {
      m.available_bytes = v;
      available = true;
    } else if (key == "MemFree") {
      m.free_bytes = v;
    } else if (key == "Cached") {
      m.cached_bytes = v;
    } else if (key == "Shmem") {
      m.shmem_bytes = v;
    } else if (key == "SwapTotal") {
      m.swap_total_bytes = v;
    } else if (key == "SwapFree") {
      m.swap_free_bytes = v;
    }
  });
  if (!total || !available) return Error::invalid("meminfo: MemTotal or MemAvailable missing");
  return m;
}

Result<MemInfo> readMemInfo(const std::string& path) {
  DSEC_ASSIGN_OR_RETURN(std::string text, readFile(path));
  auto m = parseMemInfo(text);
  if (!m.ok()) return m.error().wrap("reading " + path);
  return m;
}

std::optional<int64_t> keyedCounter(std::string_view text, std::string_view key) {
  std::optional<int64_t> out;
  forEachLine(text, [&](std::string_view line) {
    auto f = fields(line);
    int64_t v = 0;
    if (!out && f.size() >= 2 && f[0] == key && parseInt(f[1], &v)) out = v;
  });
  return out;
}

PressurePaths resolvePressurePaths(const std::string& parent, const std::string& root, const std::string& proc) {
  PressurePaths p;
  p.memory_psi = proc + "/pressure/memory";
  p.cpu_psi = proc + "/pressure/cpu";
  if (exists(root + "/cgroup.controllers")) {
    p.cgroup_version = 2;
    p.memory_dir = p.cpu_dir = root + "/" + parent;
    // The parent is created with the first sandbox; its PSI is only used once it exists (see read below).
    p.memory_psi = p.memory_dir + "/memory.pressure";
    p.cpu_psi = p.cpu_dir + "/cpu.pressure";
    p.psi_per_cgroup = true;
  } else if (exists(root + "/memory/cgroup.procs")) {
    p.cgroup_version = 1;
    p.memory_dir = root + "/memory/" + parent;
    p.cpu_dir = root + "/cpuacct/" + parent;
  }
  return p;
}

Result<ParentCgroupStats> readParentCgroupStats(const PressurePaths& paths) {
  ParentCgroupStats s;
  if (paths.cgroup_version == 0 || !exists(paths.memory_dir)) return s;
  s.exists = true;
  if (paths.cgroup_version == 2) {
    DSEC_ASSIGN_OR_RETURN(s.memory_bytes, readInt(paths.memory_dir + "/memory.current"));
    DSEC_ASSIGN_OR_RETURN(s.memory_limit_bytes, readInt(paths.memory_dir + "/memory.max"));
    if (auto ev = readFile(paths.memory_dir + "/memory.events.local"); ev.ok()) {
      s.oom_kills = keyedCounter(*ev, "oom_kill").value_or(0);
    }
    if (auto ms = readFile(paths.memory_dir + "/memory.stat"); ms.ok()) {
      s.inactive_file_bytes = keyedCounter(*ms, "inactive_file").value_or(0);
    }
    if (auto st = readFile(paths.cpu_dir + "/cpu.stat"); st.ok()) {
      s.cpu_usec = static_cast<uint64_t>(keyedCounter(*st, "usage_usec").value_or(0));
    }
  } else {
    DSEC_ASSIGN_OR_RETURN(s.memory_bytes, readInt(paths.memory_dir + "/memory.usage_in_bytes"));
    DSEC_ASSIGN_OR_RETURN(s.memory_limit_bytes, readInt(paths.memory_dir + "/memory.limit_in_bytes"));
    // v1 reports "no limit" as a huge page-aligned number.
    if (s.memory_limit_bytes >= (int64_t{1} << 60)) s.memory_limit_bytes = 0;
    if (auto oc = readFile(paths.memory_dir + "/memory.oom_control"); oc.ok()) {
      s.oom_kills = keyedCounter(*oc, "oom_kill").value_or(0);
    }
    if (auto ms = readFile(paths.memory_dir + "/memory.stat"); ms.ok()) {
      s.inactive_file_bytes = keyedCounter(*ms, "total_inactive_file").value_or(0);  // hierarchical
    }
    if (auto ns = readInt(paths.cpu_dir + "/cpuacct.usage"); ns.ok()) s.cpu_usec = static_cast<uint64_t>(*ns / 1000);
  }
  return s;
}

}  // namespace dsec
