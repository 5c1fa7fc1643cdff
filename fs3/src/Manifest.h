// manifest.json of a layer <-> LayerManifest (internal).
#pragma once

#include <string>

#include "dsec/common/Result.h"
#include "dsec/fs3/LayerStore.h"

namespace dsec::fs3 {

std::string manifestToJson(const LayerManifest& m);
// what names the file in error messages.
Result<LayerManifest> manifestFromJson(const std::string& text, const std::string& what);
// Now as RFC 3339 UTC, e.g. "2026-11-29T17:00:00Z".
std::string nowRfc3339();

}  // namespace dsec::fs3
