// The node API's snapshot routes (docs/api.md, "Snapshots, restores and forks"): POST .../snapshot and .../fork of
// a sandbox, GET and DELETE of /v1/snapshots, and POST /v1/sandboxes with "snapshot" (a restore). The node core
// does the work (NodeAgentSnapshots.cc); this maps bodies and answers.
#include "dsec/launcher/api/ApiServer.h"
#include "dsec/launcher/api/NodeJson.h"
#include "dsec/launcher/api/Requests.h"

namespace dsec::launcher {

using nlohmann::json;

void ApiServer::dispatchSnapshot(HttpExchange& ex, const RouteMatch& m) {
  switch (m.op) {
    case Op::kListSnapshots:
      ex.sendJson(200, snapshotListJson(agent_->listSnapshots()));
      return;
    case Op::kGetSnapshot: {
      auto meta = agent_->getSnapshot(m.snapshot);
      if (!meta.ok()) return sendError(ex, meta.error());
      ex.sendJson(200, toJson(*meta));
      return;
    }
    case Op::kDeleteSnapshot: {
      auto st = agent_->deleteSnapshot(m.snapshot);
      if (!st.ok()) return sendError(ex, st.error());
      ex.sendJson(200, {{"name", m.snapshot}, {"deleted", true}});
      return;
    }
    case Op::kSnapshotSandbox:
    case Op::kForkSandbox: {
      const bool fork = m.op == Op::kForkSandbox;
      auto body = readJsonBody(ex, kJsonBodyLimit, fork ? EmptyBody::kRefuse : EmptyBody::kEmptyObject);
      if (!body) return;
      auto req = parseSnapshotRequest(*body, fork);
      if (!req.ok()) return sendError(ex, req.error());
      if (!fork) {
        auto meta = agent_->snapshot(m.sandbox_id, req->name, req->processes);
        if (!meta.ok()) return sendError(ex, meta.error());
        ex.sendJson(201, toJson(*meta));
        return;
      }
      auto forked = agent_->fork(m.sandbox_id, req->count, req->processes);
      if (!forked.ok()) return sendError(ex, forked.error());
      json infos = json::array();
      for (const auto& info : forked->sandboxes) infos.push_back(toJson(info));
      ex.sendJson(201, {{"snapshot", toJson(forked->snapshot)}, {"sandboxes", std::move(infos)}});
      return;
    }
    default:
      ex.sendError(404, "not_found", "no route");
  }
}

void ApiServer::restoreSandbox(HttpExchange& ex, const json& body) {
  auto req = parseRestoreRequest(body);
  if (!req.ok()) {
    agent_->metrics().create_failures_total++;
    return sendError(ex, req.error());
  }
  auto info = agent_->restore(req->snapshot, req->options);
  if (!info.ok()) return sendError(ex, info.error());
  ex.sendJson(201, toJson(*info));
}

}  // namespace dsec::launcher
