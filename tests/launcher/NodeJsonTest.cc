// The wire form of what the node core reports (NodeJson.h): exact key sets, so that a field the API loses, gains
// or renames fails here before a client notices.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "dsec/backends/fncall/FunctionService.h"
#include "dsec/launcher/api/NodeJson.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::launcher {
namespace {

using nlohmann::json;

std::set<std::string> keysOf(const json& j) {
  std::set<std::string> keys;
  for (const auto& [key, value] : j.items()) keys.insert(key);
  return keys;
}

const std::set<std::string> kSandboxKeys = {
    "image",   "backend", "cpus",         "memory",           "disk",      "pids",     "timeout", "idle_timeout",
    "network", "env",     "labels",       "session",          "qos",       "snapshot", "id",      "node",
    "state",   "created", "created_unix", "last_active_unix", "paused_by", "usage",    "egress",  "protect"};

SandboxInfo pausedSandbox() {
  SandboxInfo info;
  info.id = "n1-00ff";
  info.node = "n1";
  info.params.image = "debian:12";
  info.params.session = "s1";
  info.params.labels = {{"team", "rl"}};
  info.state = backends::SandboxState::kPaused;
  info.created_unix = 1764547200;
  info.paused_by = PausedBy::kDensity;
  info.usage.memory_bytes = 4096;
  return info;
}

TEST(NodeJson, ASandboxHasExactlyTheFieldsOfTheApi) {
  SandboxInfo info = pausedSandbox();
  json j = toJson(info);
  EXPECT_EQ(keysOf(j), kSandboxKeys);
  EXPECT_EQ(j["backend"], "container");
  EXPECT_EQ(j["state"], "paused");
  EXPECT_EQ(j["paused_by"], "density");
  EXPECT_EQ(j["session"], "s1");
  EXPECT_TRUE(j["egress"].is_null()) << "a sandbox without a link has no egress policy";
  EXPECT_EQ(j["protect"], json::array());
  EXPECT_EQ(j["created"], "2025-12-01T00:00:00Z");
  EXPECT_EQ(j["memory"], 512LL << 20);
  EXPECT_TRUE(j["cpus"].is_number_float());
  EXPECT_EQ(keysOf(j["usage"]), (std::set<std::string>{"memory_bytes", "pids", "cpu_usec", "oom_kills"}));
  EXPECT_EQ(j["usage"]["memory_bytes"], 4096);

  info.paused_by.reset();
  info.params.session.clear();
  j = toJson(info);
  EXPECT_TRUE(j["paused_by"].is_null());
  EXPECT_TRUE(j["session"].is_null());
}

TEST(NodeJson, CpuBooksAndDensityAddTheirFields) {
  SandboxInfo info = pausedSandbox();
  info.cpu = CpuBooking{"2-3", ""};
  SandboxDensity density;
  density.reclaims = 2;
  density.paused_unix = 5.5;
  SandboxEvent oom;
  oom.kind = SandboxEvent::Kind::kOomKill;
  oom.unix_seconds = 7;
  oom.oom_kills = 1;
  oom.message = "killed";
  SandboxEvent pause;
  pause.kind = SandboxEvent::Kind::kDensityAction;
  pause.unix_seconds = 8;
  pause.density_action = "pause";
  pause.reason = "pressure";
  density.events = {oom, pause};
  info.density = density;
  json j = toJson(info);
  std::set<std::string> keys = kSandboxKeys;
  keys.insert({"cpuset", "cpuset_mems", "density", "events"});
  EXPECT_EQ(keysOf(j), keys);
  EXPECT_EQ(j["cpuset"], "2-3");
  EXPECT_TRUE(j["cpuset_mems"].is_null());
  EXPECT_EQ(keysOf(j["density"]), (std::set<std::string>{"reclaimed_unix", "reclaims", "paused_unix", "pauses"}));
  EXPECT_TRUE(j["density"]["reclaimed_unix"].is_null());
  EXPECT_EQ(j["density"]["paused_unix"], 5.5);
  ASSERT_EQ(j["events"].size(), 2u);
  EXPECT_EQ(keysOf(j["events"][0]), (std::set<std::string>{"type", "unix", "time", "oom_kills", "message"}));
  EXPECT_EQ(j["events"][0]["type"], "oom_kill");
  EXPECT_EQ(keysOf(j["events"][1]), (std::set<std::string>{"type", "unix", "time", "reason"}));
  EXPECT_EQ(j["events"][1]["type"], "density_pause");

  info.density->resumed_unix = 9;
  EXPECT_EQ(toJson(info)["density"]["resumed_unix"], 9.0);
}

TEST(NodeJson, TheNodeHasExactlyTheFieldsOfTheApi) {
  NodeInfo node;
  node.node = "n1";
  node.fleet = "default";
  node.backends = {backends::BackendKind::kContainer, backends::BackendKind::kFncall};
  node.unavailable_backends = {{backends::BackendKind::kVm, "no QEMU"}};
  node.backend_notes = {{backends::BackendKind::kMicrovm, "TCG, not KVM"}};
  node.capacity.max_sandboxes = 4;
  node.sandboxes = 1;
  json j = toJson(node);
  EXPECT_EQ(keysOf(j),
            (std::set<std::string>{"node", "fleet", "backends", "unavailable_backends", "backend_notes", "capacity",
                                   "sandboxes", "density", "admission", "isolation", "qos", "layer_store"}));
  EXPECT_EQ(j["backends"], json::array({"container", "fncall"}));
  EXPECT_EQ(j["unavailable_backends"], (json{{"vm", "no QEMU"}}));
  EXPECT_EQ(j["backend_notes"], (json{{"microvm", "TCG, not KVM"}}));
  EXPECT_EQ(keysOf(j["capacity"]), (std::set<std::string>{"max_sandboxes", "free_sandboxes", "memory_bytes",
                                                          "memory_committed_bytes", "cpus"}));
  EXPECT_EQ(j["isolation"], (json{{"user_namespaces", true}, {"warning", nullptr}}));
  EXPECT_TRUE(j["density"].is_null());
  EXPECT_TRUE(j["admission"].is_null());
  EXPECT_TRUE(j["qos"].is_null());
  EXPECT_TRUE(j["layer_store"].is_null());  // no shared store

  SharedStoreInfo store;
  store.store = "/shared/store";
  store.cache.misses = 3;
  store.cache.bytes_fetched = 3 << 17;
  store.failures = {{std::string(64, 'a'), "corrupt in the store", 5.0}};
  node.layer_store = store;
  json shared = toJson(node)["layer_store"];
  EXPECT_EQ(keysOf(shared), (std::set<std::string>{"store", "error", "chunk_cache", "prefetch", "events"}));
  EXPECT_EQ(keysOf(shared["chunk_cache"]),
            (std::set<std::string>{"capacity_bytes", "bytes", "chunks", "hits", "misses", "bytes_fetched", "evictions",
                                   "corrupt", "fetch_errors"}));
  EXPECT_EQ(keysOf(shared["prefetch"]), (std::set<std::string>{"recordings_written", "prefetches", "chunks", "bytes"}));
  EXPECT_TRUE(shared["error"].is_null());
  EXPECT_EQ(shared["chunk_cache"]["misses"], 3);
  EXPECT_EQ(shared["events"][0]["what"], "corrupt in the store");
  node.layer_store.reset();

  node.density = DensityNodeInfo{};
  node.density->actions_total = {{"pause", 1}};
  node.density->last_actions = {{1, "stop_admitting", "", 3.0, "pressure"}};
  node.qos = CpuQosNodeInfo{};
  node.qos->disabled_reason = "off";
  j = toJson(node);
  EXPECT_EQ(keysOf(j["density"]),
            (std::set<std::string>{"mode", "memory_ratio", "cpu_ratio", "admitting", "level", "reason",
                                   "memory_capacity_bytes", "memory_used_bytes", "memory_committed_bytes",
                                   "memory_admissible_bytes", "cpus", "cpu_committed", "cpu_used", "pressure",
                                   "oom_kills", "paused_sandboxes", "refusals", "actions_total", "last_actions"}));
  EXPECT_EQ(keysOf(j["density"]["pressure"]),
            (std::set<std::string>{"source", "per_cgroup", "available", "memory_some_avg10", "memory_full_avg10",
                                   "cpu_some_avg10"}));
  EXPECT_EQ(j["density"]["mode"], "static");
  EXPECT_EQ(
      j["density"]["last_actions"][0],
      (json{{"seq", 1}, {"action", "stop_admitting"}, {"sandbox", nullptr}, {"unix", 3.0}, {"reason", "pressure"}}));
  EXPECT_EQ(j["qos"], (json{{"enabled", false}, {"reason", "off"}, {"free_dedicated_cores", 0}}));
  node.qos->enabled = true;
  EXPECT_EQ(keysOf(toJson(node)["qos"]),
            (std::set<std::string>{"enabled", "exclusive_pool", "cores", "numa_domains", "dedicated_cores",
                                   "free_dedicated_cores", "shared_cpuset", "latency_sandboxes", "batch_sandboxes"}));
}

// "admission": what the node admits by; the gateway parses it back (fleet heartbeats and probes).
TEST(NodeJson, TheAdmissionStateRoundTripsAndIsChecked) {
  AdmissionInfo a;
  a.state.admitting = false;
  a.state.memory_ratio = 7.5;
  a.state.cpu_ratio = 0.8;
  a.state.memory_capacity_bytes = 1LL << 34;
  a.state.memory_committed_bytes = 3LL << 30;
  a.state.cpus = 2;
  a.state.cpu_committed = 12.5;
  a.state.cpu_used = 1.75;
  a.state.cpu_by_use = true;
  a.state.free_dedicated_cores = 1;
  a.state.free_sandboxes = 4000;
  a.level = placement::PressureLevel::kStopAdmitting;
  a.reason = "memory PSI some avg10 31.0%";
  json j = toJson(a);
  EXPECT_EQ(keysOf(j),
            (std::set<std::string>{"admitting", "level", "reason", "memory_ratio", "cpu_ratio", "memory_capacity_bytes",
                                   "memory_committed_bytes", "cpus", "cpu_committed", "cpu_used", "cpu_by_use",
                                   "free_dedicated_cores", "free_sandboxes"}));
  EXPECT_EQ(j["level"], "stop_admitting");
  auto back = parseAdmissionJson(j);
  ASSERT_TRUE(back.ok()) << back.error().message();
  EXPECT_EQ(back->state, a.state);
  EXPECT_EQ(back->level, a.level);
  EXPECT_EQ(back->reason, a.reason);
  json missing = j;
  missing.erase("memory_ratio");
  ASSERT_FALSE(parseAdmissionJson(missing).ok());
  EXPECT_NE(parseAdmissionJson(missing).error().message().find("memory_ratio"), std::string::npos);
  json bad_level = j;
  bad_level["level"] = "panic";
  EXPECT_FALSE(parseAdmissionJson(bad_level).ok());
  json negative = j;
  negative["cpu_ratio"] = -1;
  EXPECT_FALSE(parseAdmissionJson(negative).ok());
  json negative_use = j;
  negative_use["cpu_used"] = -0.5;
  EXPECT_FALSE(parseAdmissionJson(negative_use).ok());
  // A node that admits CPUs by limits only sends neither cpu_used nor cpu_by_use: that rule, then.
  json by_limits = j;
  by_limits.erase("cpu_used");
  by_limits.erase("cpu_by_use");
  auto limits = parseAdmissionJson(by_limits);
  ASSERT_TRUE(limits.ok()) << limits.error().message();
  EXPECT_FALSE(limits->state.cpu_by_use);
  EXPECT_EQ(limits->state.cpu_used, 0);
  EXPECT_FALSE(parseAdmissionJson(json::array()).ok());
}

TEST(NodeJson, TheFncallReportHasExactlyTheFieldsOfTheApi) {
  backends::fncall::FncallStats stats;
  stats.max_workers = 8;
  stats.workers = 2;
  stats.calls = 7;
  stats.pools.push_back({"debian:12", backends::fncall::Language::kBash, 1, 1, 0, 0, 7, std::nullopt});
  json j = toJson(stats, "debian:12");
  EXPECT_EQ(keysOf(j),
            (std::set<std::string>{"max_workers", "default_image", "workers", "idle", "busy", "creating", "calls",
                                   "errors", "timeouts", "oom_kills", "rejected", "workers_created",
                                   "worker_create_failures", "workers_replaced", "workers_shrunk", "pools"}));
  EXPECT_EQ(j["max_workers"], 8);
  EXPECT_EQ(j["default_image"], "debian:12");
  ASSERT_EQ(j["pools"].size(), 1u);
  EXPECT_EQ(keysOf(j["pools"][0]),
            (std::set<std::string>{"image", "language", "idle", "busy", "creating", "waiting", "calls"}));
  EXPECT_EQ(j["pools"][0]["language"], "bash");
  stats.pools[0].last_error = "no such image";
  EXPECT_EQ(toJson(stats, "debian:12")["pools"][0]["last_error"], "no such image");
}

TEST(NodeJson, SessionsAttachAndDelete) {
  Session s;
  s.name = "run";
  s.sandboxes = {"n1-a"};
  json j = toJson(s);
  EXPECT_EQ(keysOf(j),
            (std::set<std::string>{"name", "lease", "retention", "state", "expires_unix", "lapsed_unix", "sandboxes"}));
  EXPECT_EQ(j["state"], "active");
  s.lapsed_unix = 12;
  EXPECT_EQ(toJson(s)["state"], "lapsed");
  AttachedSession attached{s, {pausedSandbox()}};
  j = toJson(attached);
  ASSERT_EQ(j["sandbox_infos"].size(), 1u);
  EXPECT_EQ(j["sandbox_infos"][0]["id"], "n1-00ff");
  EXPECT_EQ(toJson(DeletedSession{"run", 2}), (json{{"name", "run"}, {"destroyed", 2}}));
  EXPECT_EQ(sessionListJson({s})["sessions"].size(), 1u);
  EXPECT_EQ(sandboxListJson({})["sandboxes"], json::array());
}

TEST(BackendKind, NamesRoundTripAndUnknownNamesSayWhatIsKnown) {
  for (auto kind : {backends::BackendKind::kContainer, backends::BackendKind::kFncall, backends::BackendKind::kMicrovm,
                    backends::BackendKind::kVm}) {
    auto parsed = backends::parseBackendKind(backends::backendKindName(kind));
    ASSERT_OK(parsed);
    EXPECT_EQ(*parsed, kind);
  }
  auto unknown = backends::parseBackendKind("docker");
  ASSERT_ERROR(unknown, ErrorCode::kInvalidArgument);
  EXPECT_NE(unknown.error().message().find("known: container, fncall, microvm, vm"), std::string::npos);
}

}  // namespace
}  // namespace dsec::launcher
