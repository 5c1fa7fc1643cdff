// A backend for simulated nodes (`dsec serve --simulate`, `dsec bench gateway`): its sandboxes hold no
// processes, mounts or cgroups, so a node agent can admit, list, pause and destroy thousands of them per
// second and the control plane (API, admission, gateway, placement) can be measured on its own. Everything
// that would need a process (exec, files, spawn) fails with a clear kUnsupported "simulated node" error.
#pragma once

#include <memory>

#include "dsec/backends/Sandbox.h"
#include "dsec/placement/DensityController.h"

namespace dsec::launcher {

// The name the backend reports; the node still offers the "container" backend to clients, so requests take
// exactly the path they take on a real node.
constexpr const char* kSimulatedBackendName = "simulated";

std::unique_ptr<backends::Backend> makeSimulatedBackend();

// The density controller of a simulated node still admits by its books (committed against capacity x ratio)
// but never reacts to the host's pressure: its sandboxes use nothing, and other work on the host must not
// close its admission (or pause records) in the middle of a measurement.
placement::DensityConfig simulatedDensityConfig(placement::DensityConfig base = {});

}  // namespace dsec::launcher
