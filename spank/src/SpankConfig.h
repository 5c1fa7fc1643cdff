// What the SPANK plugin is told: plugstack.conf arguments (key=value, once per node) and the per-step
// options (--dsec-* on srun/sbatch/salloc, with DSEC_* environment defaults). Pure parsing and validation,
// no Slurm types, so it is unit-tested without a cluster and used the same way in srun and slurmstepd.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dsec/backends/Sandbox.h"
#include "dsec/common/Result.h"

namespace dsec::spank {

// plugstack.conf: `required /path/spank_dsec.so root=/var/lib/dsec backend=container ...`
struct PluginArgs {
  std::string root = "/var/lib/dsec";        // layer store
  std::string backend = "container";         // the only backend a step can use today
  std::string cgroup_parent = "dsec-spank";  // apart from `dsec serve`'s "dsec", which reaps what it does not know
  std::string init_path;                     // dsec-sandbox-init; empty = next to the plugin, then the build tree
  backends::NetworkMode network = backends::NetworkMode::kNone;  // default of --dsec-net
  int64_t disk_bytes = 1LL << 30;                                // size of each step sandbox's writable upper (tmpfs)
};
// Unknown keys, missing '=' and bad values are errors naming the argument.
Result<PluginArgs> parsePluginArgs(const std::vector<std::string>& args);

struct MountSpec {
  std::string source;  // host path
  std::string target;  // path inside the sandbox
  bool read_only = false;
  bool operator==(const MountSpec&) const = default;
};
// "SRC:DST[:ro|:rw][,SRC:DST...]": both absolute, no '..' component, DST not '/'.
Result<std::vector<MountSpec>> parseMounts(std::string_view text);
std::string mountsToString(const std::vector<MountSpec>& mounts);

// One entry per option, in the order of the options table.
enum class OptionId { kImage = 0, kBackend, kMem, kWorkdir, kMount, kNet, kCount };
struct OptionInfo {
  OptionId id;
  const char* name;     // without the leading "--"
  const char* arginfo;  // shown in --help
  const char* usage;
  const char* env;  // environment default
};
const std::vector<OptionInfo>& optionTable();

// Option values as given (command line, or Slurm's SLURM_SPANK__SLURM_SPANK_OPTION_dsec_* variables).
// --dsec-mount may be repeated: every occurrence is kept.
struct RawOptions {
  std::optional<std::string> values[static_cast<int>(OptionId::kCount)];
  std::vector<std::string> mounts;
  void set(OptionId id, std::string value);
  const std::optional<std::string>& get(OptionId id) const { return values[static_cast<int>(id)]; }
};
// Checks one value on its own (the option callback: a bad value fails srun/sbatch right away).
Status validateOption(OptionId id, std::string_view value);

// What a step runs with.
struct StepOptions {
  std::string image;  // empty: no sandbox for this step
  std::string backend;
  int64_t memory_bytes = 0;  // 0 = take the step's Slurm allocation
  std::string workdir = "/";
  std::vector<MountSpec> mounts;
  backends::NetworkMode network = backends::NetworkMode::kNone;
};
// Options win over environment defaults (getenv returns nullptr for unset). Every value is validated;
// the error names the option or variable and what is wrong with it.
using EnvLookup = std::function<std::optional<std::string>(const char* name)>;
Result<StepOptions> resolveOptions(const RawOptions& raw, const EnvLookup& env, const PluginArgs& args);

}  // namespace dsec::spank
