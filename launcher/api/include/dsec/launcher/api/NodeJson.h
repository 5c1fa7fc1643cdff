// The wire form (docs/api.md) of what the node core reports (launcher/node Infos.h): the one place the API's
// field names for sandboxes, the node, sessions and layers are spelled.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dsec/common/Result.h"
#include "dsec/launcher/node/Infos.h"
#include "dsec/launcher/node/NodeFncall.h"
#include "dsec/launcher/node/Snapshots.h"

namespace dsec::launcher {

nlohmann::json toJson(const SandboxInfo& info);
// {"sandboxes": [...]}
nlohmann::json sandboxListJson(const std::vector<SandboxInfo>& infos);
// GET /v1/node as the core sees it; the API server adds its own parts (output budget, HTTP, fncall stats).
nlohmann::json toJson(const NodeInfo& info);
// "admission" of GET /v1/node and of a fleet node's registration: what the node admits by (placement/Admission.h).
nlohmann::json toJson(const AdmissionInfo& admission);
// Its inverse, for the gateway: a missing or malformed field is an error naming it.
Result<AdmissionInfo> parseAdmissionJson(const nlohmann::json& j);
// The fncall service's report ("fncall" of GET /v1/node), with the image a call that names none runs on.
nlohmann::json toJson(const backends::fncall::FncallStats& stats, const std::string& default_image);
nlohmann::json fncallJson(NodeFncall& fncall);

nlohmann::json toJson(const Session& session);
// {"sessions": [...]}
nlohmann::json sessionListJson(const std::vector<Session>& sessions);
// The session with "sandbox_infos".
nlohmann::json toJson(const AttachedSession& attached);
nlohmann::json toJson(const DeletedSession& deleted);

// {"layers": [...]}: each manifest with "mounted" and "refs".
// {"name","kind","backend","image","source","node","created","created_unix","bytes"}
nlohmann::json toJson(const SnapshotMeta& meta);
nlohmann::json snapshotListJson(const std::vector<SnapshotMeta>& snapshots);  // {"snapshots": [...]}
nlohmann::json layerListJson(const std::vector<LayerStatus>& layers);

}  // namespace dsec::launcher
