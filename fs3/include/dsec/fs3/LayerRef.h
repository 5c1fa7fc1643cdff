// Names of layers and images. A layer is NAME:VERSION (name [a-z0-9][a-z0-9._-]*,
// version [A-Za-z0-9][A-Za-z0-9._-]*, each at most 64 chars); an image is an ordered stack of layers, bottom
// first, joined by '+':
// "debian:12+python:3.11+ws-demo:1".
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "dsec/common/Result.h"

namespace dsec::fs3 {

struct LayerRef {
  std::string name;
  std::string version;
  std::string toString() const { return name + ":" + version; }
  bool operator==(const LayerRef&) const = default;
  auto operator<=>(const LayerRef&) const = default;
};

inline constexpr size_t kMaxLayerPartLength = 64;
// Overlay mount options live in one page: with long store roots ~30 lowerdirs fit, so cap images at 32 layers.
inline constexpr size_t kMaxImageLayers = 32;

// Checks a LayerRef built by hand (e.g. from JSON) the same way parseLayerRef does: the parts become path
// components in the store, so this is what keeps "../x" out of it.
Status validateLayerRef(const LayerRef& ref);
Result<LayerRef> parseLayerRef(std::string_view text);
// Bottom-first list; rejects empty images, empty parts, bad refs, a layer name listed twice (even with two
// different versions) and more than kMaxImageLayers layers.
Result<std::vector<LayerRef>> parseImageRef(std::string_view text);
std::string imageToString(const std::vector<LayerRef>& layers);

}  // namespace dsec::fs3
