// Every flag of the node option table (NodeOptionTable.h) with a value and what it must set: the cases both
// fronts, `dsec serve` (tests/launcher/NodeOptionTableTest.cc) and dsec-launch (tests/fleet/LaunchOptionsTest.cc),
// run through their parsers.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "dsec/launcher/api/Serve.h"

namespace dsec::launcher {

struct FlagCase {
  std::vector<std::string> args;
  std::function<bool(const ServeOptions&)> holds;
};

// with_serve_only: also the flags only `dsec serve` takes from the table (--listen, --node-name; dsec-launch sets
// them its own way).
inline std::vector<FlagCase> everyNodeFlag(bool with_serve_only) {
  std::vector<FlagCase> cases = {
      {{"--fleet-name", "eval"}, [](const ServeOptions& o) { return o.node.fleet_name == "eval"; }},
      {{"--max-sandboxes", "7"}, [](const ServeOptions& o) { return o.node.max_sandboxes == 7; }},
      {{"--reaper-interval", "0.5"}, [](const ServeOptions& o) { return o.node.reaper_interval_seconds == 0.5; }},
      {{"--cgroup-parent", "dsec-x"}, [](const ServeOptions& o) { return o.node.cgroup_parent == "dsec-x"; }},
      {{"--snapshot-dir", "/srv/snaps"}, [](const ServeOptions& o) { return o.node.snapshot_dir == "/srv/snaps"; }},
      {{"--snapshot-retention", "3600"},
       [](const ServeOptions& o) { return o.node.snapshot_retention_seconds == 3600; }},
      {{"--simulate"}, [](const ServeOptions& o) { return o.node.simulate; }},
      {{"--store", "/tmp"}, [](const ServeOptions& o) { return o.node.store_dir == "/tmp"; }},
      {{"--store", "http://10.0.0.9:8480"},
       [](const ServeOptions& o) { return o.node.store_dir == "http://10.0.0.9:8480"; }},
      {{"--chunk-cache", "1G"}, [](const ServeOptions& o) { return o.node.chunk_cache_bytes == (1ll << 30); }},
      {{"--fncall-image", "alpine:3"}, [](const ServeOptions& o) { return o.node.fncall.image == "alpine:3"; }},
      {{"--fncall-workers", "3"}, [](const ServeOptions& o) { return o.node.fncall.max_workers == 3; }},
      {{"--fncall-queue-wait", "0.25"}, [](const ServeOptions& o) { return o.node.fncall.queue_wait_seconds == 0.25; }},
      {{"--overcommit", "off"}, [](const ServeOptions& o) { return !o.node.density.overcommit; }},
      {{"--memory-ratio-start", "4"}, [](const ServeOptions& o) { return o.node.density.memory_ratio_start == 4; }},
      {{"--memory-ratio-min", "2"}, [](const ServeOptions& o) { return o.node.density.memory_ratio_min == 2; }},
      {{"--memory-ratio-max", "16"}, [](const ServeOptions& o) { return o.node.density.memory_ratio_max == 16; }},
      {{"--cpu-ratio-start", "0.5"}, [](const ServeOptions& o) { return o.node.density.cpu_ratio_start == 0.5; }},
      {{"--cpu-ratio-min", "0.5"}, [](const ServeOptions& o) { return o.node.density.cpu_ratio_min == 0.5; }},
      {{"--cpu-ratio-max", "2"}, [](const ServeOptions& o) { return o.node.density.cpu_ratio_max == 2; }},
      {{"--memory-capacity", "1G"}, [](const ServeOptions& o) { return o.node.memory_capacity_bytes == 1 << 30; }},
      {{"--density-interval", "2"}, [](const ServeOptions& o) { return o.node.density_interval_seconds == 2; }},
      {{"--cpu-qos", "off"}, [](const ServeOptions& o) { return !o.node.cpu_qos; }},
      {{"--cpu-exclusive-pool", "off"}, [](const ServeOptions& o) { return !o.node.cpu_exclusive_pool; }},
      {{"--user-namespaces", "off"}, [](const ServeOptions& o) { return !o.node.user_namespaces; }},
      {{"--vm", "off"}, [](const ServeOptions& o) { return !o.node.vm.enabled; }},
      {{"--vm-kernel-dir", "/opt/k"}, [](const ServeOptions& o) { return o.node.vm.kernel_dir == "/opt/k"; }},
      {{"--vm-accel", "tcg"}, [](const ServeOptions& o) { return o.node.vm.accel == "tcg"; }},
      {{"--vm-memory", "1G"}, [](const ServeOptions& o) { return o.node.vm.default_memory_bytes == (1ll << 30); }},
      {{"--egress-never", "10.9.0.0/16"},
       [](const ServeOptions& o) { return o.node.egress_never == std::vector<std::string>{"10.9.0.0/16"}; }},
      {{"--max-connections", "10"}, [](const ServeOptions& o) { return o.http.max_connections == 10; }},
      {{"--max-client-connections", "3"}, [](const ServeOptions& o) { return o.http.max_client_connections == 3; }},
      {{"--client-queue-wait", "1.5"}, [](const ServeOptions& o) { return o.http.client_queue_seconds == 1.5; }},
      {{"--header-timeout", "5"}, [](const ServeOptions& o) { return o.http.header_timeout_seconds == 5; }},
      {{"--body-timeout", "6"}, [](const ServeOptions& o) { return o.http.body_timeout_seconds == 6; }},
      {{"--body-min-rate", "1k"}, [](const ServeOptions& o) { return o.http.body_min_rate == 1024; }},
      {{"--idle-timeout", "30"}, [](const ServeOptions& o) { return o.http.idle_timeout_ms == 30000; }},
      {{"--output-budget", "2M"}, [](const ServeOptions& o) { return o.output_budget_bytes == 2u << 20; }},
      {{"--run-code-listen", "10.1.2.3:8471"},
       [](const ServeOptions& o) { return o.run_code_listen == "10.1.2.3:8471"; }},
      {{"--run-code-cpp-image", "debian:12+gcc:13"},
       [](const ServeOptions& o) { return o.run_code.cpp_image == "debian:12+gcc:13"; }},
  };
  if (with_serve_only) {
    cases.push_back(
        {{"--listen", "0.0.0.0:9000"}, [](const ServeOptions& o) { return o.http.listen == "0.0.0.0:9000"; }});
    cases.push_back({{"--node-name", "n7"}, [](const ServeOptions& o) { return o.node.node_name == "n7"; }});
    cases.push_back(
        {{"--e2b-listen", "127.0.0.1:49999"}, [](const ServeOptions& o) { return o.e2b.listen == "127.0.0.1:49999"; }});
    cases.push_back({{"--e2b-template", "agent=debian:12"}, [](const ServeOptions& o) {
                       auto it = o.e2b.templates.find("agent");
                       return it != o.e2b.templates.end() && it->second == "debian:12";
                     }});
    cases.push_back({{"--e2b-default-image", "debian:12+python:3.11"},
                     [](const ServeOptions& o) { return o.e2b.default_image == "debian:12+python:3.11"; }});
  }
  return cases;
}

}  // namespace dsec::launcher
