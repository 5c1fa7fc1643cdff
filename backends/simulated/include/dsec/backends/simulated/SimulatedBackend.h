// A backend for simulated nodes (`dsec serve --simulate`, `dsec bench gateway`) and for unprivileged tests of
// the node core: its sandboxes hold no processes, mounts or cgroups, so a node agent can admit, list, pause,
// re-adopt and destroy thousands of them per second, and the control plane (API, admission, gateway,
// placement) can be measured on its own. Everything that would need a process (exec, files, spawn) fails with
// a clear kUnsupported "simulated node" error.
#pragma once

#include <memory>

#include "dsec/backends/Sandbox.h"

namespace dsec::backends {

constexpr const char* kSimulatedBackendName = "simulated";

std::unique_ptr<Backend> makeSimulatedBackend();

}  // namespace dsec::backends
