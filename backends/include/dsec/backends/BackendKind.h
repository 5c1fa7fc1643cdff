// The kinds of sandbox backend a create can ask for, and their names: the one place a backend's name (in a create
// request, a node's info, a state record, a SPANK option) is spelled.
#pragma once

#include <string>
#include <string_view>

#include "dsec/common/Result.h"

namespace dsec::backends {

// kContainer is the only kind a node creates sandboxes of today; the fncall backend serves POST /v1/call, and
// microvm and vm are named so that clients asking for them hear "not available" rather than "unknown".
enum class BackendKind { kContainer, kFncall, kMicrovm, kVm };

const char* backendKindName(BackendKind kind);
// kInvalidArgument naming the known kinds for anything else.
Result<BackendKind> parseBackendKind(std::string_view name);

}  // namespace dsec::backends
