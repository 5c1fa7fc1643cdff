// One sandbox's record on disk: what a restarted node re-adopts it from. It is the node's own format, versioned
// and independent of the API's JSON: renaming an API field changes nothing a restarted node reads.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "dsec/common/Result.h"
#include "dsec/launcher/node/CreateParams.h"

namespace dsec::launcher {

// Why a sandbox is paused while it is.
enum class PausedBy {
  kNone,
  kUser,     // POST .../pause
  kLease,    // its session's lease lapsed
  kDensity,  // the density controller, under memory pressure
};
// "user", "lease", "density"; "" for kNone.
std::string_view pausedByName(PausedBy by);
// The inverse; an unknown name is kUser (a paused sandbox stays paused until someone resumes it).
PausedBy parsePausedBy(std::string_view name);

// Version 1: {"version": 1, "id", "created_unix", "params": {...}, "paused_by", "backend_state", "cpuset",
// "slurm_job"}; "slurm_job" (the Slurm job that owns the sandbox, null outside Slurm) is optional: records of
// earlier nodes have none.
// Version 0 (no "version"): the flat format of earlier nodes, the API's sandbox info; still read.
constexpr int kStateRecordVersion = 1;

struct SandboxStateRecord {
  std::string id;
  CreateParams params;
  double created_unix = 0;
  PausedBy paused_by = PausedBy::kNone;                     // kNone: running when written
  nlohmann::json backend_state = nlohmann::json::object();  // the backend's persistentState(), opaque here
  std::string cpuset;  // a latency sandbox's dedicated cores, to book again ("" none)
  // The Slurm job whose agent holds the sandbox ("" outside Slurm): its epilog destroys the sandbox, and an
  // agent of another job never silently re-adopts it (docs/fleet.md, "Which job owns what").
  std::string slurm_job;
};

// A record's "params" (the node's own names; snapshot.json reuses them for the source's parameters).
nlohmann::json paramsRecordJson(const CreateParams& params);
Result<CreateParams> paramsFromJson(const nlohmann::json& json);

std::string encodeStateRecord(const SandboxStateRecord& record);
// kInvalidArgument naming what is wrong; kUnsupported for a version newer than this node's (not guessed at: the
// node refuses to start rather than reap sandboxes a newer node still owns).
Result<SandboxStateRecord> decodeStateRecord(std::string_view text);
// The backend state of a record that does not decode otherwise (so its leftovers can still be reaped); an empty
// object when the text is not JSON at all.
nlohmann::json backendStateOf(std::string_view text);

}  // namespace dsec::launcher
