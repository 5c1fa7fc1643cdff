// Validation of everything a client sends: JSON bodies of create and exec, query values, paths. Pure logic
// (no backend), so every rule is unit-tested; each error names the field that is wrong.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "dsec/backends/Sandbox.h"
#include "dsec/common/Result.h"
#include "dsec/fs3/LayerRef.h"
#include "dsec/launcher/node/CreateParams.h"
#include "dsec/launcher/node/Sessions.h"
#include "dsec/launcher/node/Snapshots.h"

namespace dsec::launcher {

// Parses a request body into JSON, refusing non-objects and absurd nesting (which would otherwise cost
// recursion depth later).
Result<nlohmann::json> parseJsonObject(std::string_view body);

// node_memory_bytes bounds the memory limit (0 skips that check). Unknown backends are kInvalidArgument;
// known but unavailable ones (fncall, microvm, vm) kUnsupported.
Result<CreateParams> parseCreateRequest(const nlohmann::json& body, int64_t node_memory_bytes);

// POST /v1/sandboxes with "snapshot": {"snapshot", "timeout"?, "idle_timeout"?, "labels"?, "session"?}; any other
// field is a 400 naming it (the image, backend and limits are the snapshot's).
struct RestoreRequest {
  std::string snapshot;
  RestoreOptions options;
};
Result<RestoreRequest> parseRestoreRequest(const nlohmann::json& body);

// POST .../snapshot {"name"?, "processes"?} and POST .../fork {"count": 1..256, "processes"?}.
struct SnapshotRequest {
  std::string name;  // "" = generated
  bool processes = false;
  int count = 0;  // fork
};
Result<SnapshotRequest> parseSnapshotRequest(const nlohmann::json& body, bool fork);

// The body of PUT /v1/sessions/{name} ({"lease", "retention"}) or of an attach ({"lease"} only: allow_retention
// false). 400 naming the field.
Result<SessionSettings> parseSessionSettings(const nlohmann::json& body, bool allow_retention);

// The bytes of a body's "stdin" (text) or "stdin_b64" (base64), at most one of them; "" when neither.
Result<std::string> parseStdinFields(const nlohmann::json& body);

// The exec body: cmd (string -> /bin/sh -c, or argv array), timeout, cwd, env, stdin | stdin_b64, output_cap.
Result<backends::ExecRequest> parseExecRequest(const nlohmann::json& body);

// "a string", "a number", "a fractional number", ... for messages naming what a field held instead.
std::string jsonTypeName(const nlohmann::json& v);
// kInvalidArgument "field 'NAME': what is wrong".
Error fieldError(const std::string& field, const std::string& what);
Result<std::string> parseStringField(const nlohmann::json& v, const std::string& field);

// Field helpers (exposed for tests): sizes are non-negative integers or strings like "512M".
Result<int64_t> parseSizeField(const nlohmann::json& value, const std::string& field);
Result<double> parseDurationField(const nlohmann::json& value, const std::string& field);
Result<std::map<std::string, std::string>> parseEnvField(const nlohmann::json& value, const std::string& field);
Result<std::map<std::string, std::string>> parseLabelsField(const nlohmann::json& value);

// An absolute path inside a sandbox: starts with '/', no NUL, at most 4096 bytes.
Status validateSandboxPath(std::string_view path, const std::string& field = "path");
// Octal permission bits "0644" / "755".
Result<uint32_t> parseFileMode(std::string_view text);
// "k=v" selectors of ?label=...
Result<std::map<std::string, std::string>> parseLabelSelectors(const std::vector<std::string>& values);

// Constant-time comparison for the bearer token.
bool constantTimeEquals(std::string_view a, std::string_view b);
// Whether an Authorization header value carries `token`: scheme "Bearer" in any case (RFC 9110), blanks around
// the token ignored, the token compared in constant time. The one check of the node API and the gateway.
bool bearerTokenMatches(std::string_view authorization, std::string_view token);

}  // namespace dsec::launcher
