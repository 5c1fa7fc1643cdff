#include "SpankConfig.h"

#include "dsec/backends/BackendKind.h"
#include "dsec/common/Strings.h"
#include "dsec/fs3/LayerRef.h"

namespace dsec::spank {
namespace {

constexpr const char* kKnownArgs = "root, backend, cgroup_parent, init, network, disk";

Status checkBackend(std::string_view value) {
  auto kind = backends::parseBackendKind(value);
  if (kind.ok() && *kind == backends::BackendKind::kContainer) return okStatus();
  return Error::invalid("unknown backend '" + std::string(value) + "' (supported: container)");
}

Result<backends::NetworkMode> parseNetwork(std::string_view value) {
  if (value == "none") return backends::NetworkMode::kNone;
  if (value == "host") return backends::NetworkMode::kHost;
  return Error::invalid("network must be none or host, not '" + std::string(value) + "'");
}

bool hasDotDot(std::string_view path) {
  for (const auto& part : split(path, '/')) {
    if (part == "..") return true;
  }
  return false;
}

// Paths travel through comma/colon separated lists, mount calls and the job environment.
Status checkAbsolutePath(std::string_view what, std::string_view path) {
  if (path.empty() || path[0] != '/') {
    return Error::invalid(std::string(what) + " must be an absolute path, not '" + std::string(path) + "'");
  }
  if (path.find('\0') != std::string_view::npos || path.find('\n') != std::string_view::npos) {
    return Error::invalid(std::string(what) + " contains a NUL or newline");
  }
  if (hasDotDot(path)) return Error::invalid(std::string(what) + " must not contain '..': " + std::string(path));
  if (path.size() > 4000) return Error::invalid(std::string(what) + " is too long");
  return okStatus();
}

Result<int64_t> parseMemory(std::string_view value) {
  auto bytes = parseByteSize(value);
  if (!bytes.ok()) return bytes.error();
  if (*bytes < (4 << 20)) return Error::invalid("memory '" + std::string(value) + "' is below the minimum of 4M");
  return *bytes;
}

}  // namespace

Result<PluginArgs> parsePluginArgs(const std::vector<std::string>& args) {
  PluginArgs out;
  for (const auto& arg : args) {
    auto eq = arg.find('=');
    if (eq == std::string::npos || eq == 0) {
      return Error::invalid("plugstack.conf argument '" + arg + "' is not key=value (known keys: " + kKnownArgs + ")");
    }
    std::string key = arg.substr(0, eq);
    std::string value = arg.substr(eq + 1);
    auto bad = [&](const Error& e) { return Error::invalid("plugstack.conf argument " + key + ": " + e.message()); };
    if (key == "root") {
      if (auto s = checkAbsolutePath("root", value); !s.ok()) return bad(s.error());
      out.root = value;
    } else if (key == "backend") {
      if (auto s = checkBackend(value); !s.ok()) return bad(s.error());
      out.backend = value;
    } else if (key == "cgroup_parent") {
      if (value.empty() || value[0] == '/' || hasDotDot(value) || value.find_first_of(",:\n ") != std::string::npos) {
        return bad(
            Error::invalid("cgroup_parent must be a relative cgroup path such as dsec-spank, not '" + value + "'"));
      }
      out.cgroup_parent = value;
    } else if (key == "init") {
      if (auto s = checkAbsolutePath("init", value); !s.ok()) return bad(s.error());
      out.init_path = value;
    } else if (key == "network") {
      auto net = parseNetwork(value);
      if (!net.ok()) return bad(net.error());
      out.network = *net;
    } else if (key == "disk") {
      auto bytes = parseByteSize(value);
      if (!bytes.ok()) return bad(bytes.error());
      if (*bytes < (1 << 20)) return bad(Error::invalid("disk must be at least 1M"));
      out.disk_bytes = *bytes;
    } else {
      return Error::invalid("unknown plugstack.conf argument '" + key + "' (known keys: " + kKnownArgs + ")");
    }
  }
  return out;
}

Result<std::vector<MountSpec>> parseMounts(std::string_view text) {
  std::vector<MountSpec> out;
  for (const auto& item : split(text, ',')) {
    if (item.empty()) continue;  // "a:b," and ",," are harmless
    auto parts = split(item, ':');
    if (parts.size() < 2 || parts.size() > 3) {
      return Error::invalid("mount '" + item + "' must be SRC:DST or SRC:DST:ro");
    }
    MountSpec m{parts[0], parts[1], false};
    if (parts.size() == 3) {
      if (parts[2] == "ro") {
        m.read_only = true;
      } else if (parts[2] != "rw") {
        return Error::invalid("mount '" + item + "': flag must be ro or rw, not '" + parts[2] + "'");
      }
    }
    if (auto s = checkAbsolutePath("mount source", m.source); !s.ok()) return s.error().wrap("mount '" + item + "'");
    if (auto s = checkAbsolutePath("mount target", m.target); !s.ok()) return s.error().wrap("mount '" + item + "'");
    if (m.target.find_first_not_of('/') == std::string::npos) {
      return Error::invalid("mount '" + item + "': cannot mount over the sandbox's root");
    }
    out.push_back(std::move(m));
  }
  if (out.empty()) return Error::invalid("empty mount list");
  return out;
}

std::string mountsToString(const std::vector<MountSpec>& mounts) {
  std::string out;
  for (const auto& m : mounts) {
    if (!out.empty()) out += ',';
    out += m.source + ":" + m.target + (m.read_only ? ":ro" : "");
  }
  return out;
}

const std::vector<OptionInfo>& optionTable() {
  // Built on first use (a function-local static): no global constructor runs when Slurm dlopens the plugin.
  static const std::vector<OptionInfo> table = {
      {OptionId::kImage, "dsec-image", "IMAGE",
       "Run the step in a dsec sandbox of IMAGE (layers bottom first: debian:12+python:3.11) [env DSEC_IMAGE]",
       "DSEC_IMAGE"},
      {OptionId::kBackend, "dsec-backend", "BACKEND", "Sandbox backend: container [env DSEC_BACKEND]", "DSEC_BACKEND"},
      {OptionId::kMem, "dsec-mem", "SIZE",
       "Memory limit of the step's sandbox (512M, 4G); default: the step's Slurm allocation [env DSEC_MEM]",
       "DSEC_MEM"},
      {OptionId::kWorkdir, "dsec-workdir", "DIR",
       "Working directory of the tasks inside the sandbox (default /) "
       "[env DSEC_WORKDIR]",
       "DSEC_WORKDIR"},
      {OptionId::kMount, "dsec-mount", "SRC:DST[:ro]",
       "Bind a host path into the sandbox (repeatable or comma-separated) [env DSEC_MOUNT]", "DSEC_MOUNT"},
      {OptionId::kNet, "dsec-net", "none|host",
       "Sandbox network: none (loopback only) or host (the node's) [env DSEC_NET]", "DSEC_NET"},
  };
  return table;
}

void RawOptions::set(OptionId id, std::string value) {
  if (id == OptionId::kMount) mounts.push_back(value);
  values[static_cast<int>(id)] = std::move(value);
}

Status validateOption(OptionId id, std::string_view value) {
  switch (id) {
    case OptionId::kImage: {
      auto layers = fs3::parseImageRef(value);
      if (!layers.ok()) return layers.error();
      return okStatus();
    }
    case OptionId::kBackend:
      return checkBackend(value);
    case OptionId::kMem: {
      auto bytes = parseMemory(value);
      if (!bytes.ok()) return bytes.error();
      return okStatus();
    }
    case OptionId::kWorkdir:
      return checkAbsolutePath("workdir", value);
    case OptionId::kMount: {
      auto mounts = parseMounts(value);
      if (!mounts.ok()) return mounts.error();
      return okStatus();
    }
    case OptionId::kNet: {
      auto net = parseNetwork(value);
      if (!net.ok()) return net.error();
      return okStatus();
    }
    case OptionId::kCount:
      break;
  }
  return Error::internal("bad option id");
}

Result<StepOptions> resolveOptions(const RawOptions& raw, const EnvLookup& env, const PluginArgs& args) {
  StepOptions out;
  out.backend = args.backend;
  out.network = args.network;
  for (const auto& info : optionTable()) {
    std::optional<std::string> value = raw.get(info.id);
    std::string origin = std::string("--") + info.name;
    if (!value) {
      value = env(info.env);
      origin = info.env;
    }
    if (!value) continue;
    std::vector<std::string> values = {*value};
    if (info.id == OptionId::kMount && !raw.mounts.empty() && origin[0] == '-') values = raw.mounts;
    for (const auto& v : values) {
      if (auto s = validateOption(info.id, v); !s.ok()) return s.error().wrap(origin + "=" + v);
    }
    switch (info.id) {
      case OptionId::kImage:
        out.image = *value;
        break;
      case OptionId::kBackend:
        out.backend = *value;
        break;
      case OptionId::kMem:
        out.memory_bytes = *parseMemory(*value);
        break;
      case OptionId::kWorkdir:
        out.workdir = *value;
        break;
      case OptionId::kMount:
        for (const auto& v : values) {
          auto mounts = parseMounts(v);
          out.mounts.insert(out.mounts.end(), mounts->begin(), mounts->end());
        }
        break;
      case OptionId::kNet:
        out.network = *parseNetwork(*value);
        break;
      case OptionId::kCount:
        break;
    }
  }
  return out;
}

}  // namespace dsec::spank
