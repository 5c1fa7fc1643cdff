#include "dsec/fs3/LayerRef.h"

#include <set>

namespace dsec::fs3 {
namespace {

bool isLower(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }
bool isAlnum(char c) { return isLower(c) || (c >= 'A' && c <= 'Z'); }
bool isPunct(char c) { return c == '.' || c == '_' || c == '-'; }

// Both parts become path components (<root>/layers/NAME/VERSION), so the first character can never be '.'
// (no "." or ".." and no hidden names that would collide with the store's ".tmp-*" dirs).
Status checkPart(std::string_view part, std::string_view what, std::string_view pattern, bool lower_only,
                 std::string_view whole) {
  std::string ctx = "in layer reference '" + std::string(whole) + "'";
  if (part.empty()) return Error::invalid("empty layer " + std::string(what) + " " + ctx + " (want NAME:VERSION)");
  if (part.size() > kMaxLayerPartLength) {
    return Error::invalid("layer " + std::string(what) + " '" + std::string(part) + "' " + ctx + " is longer than " +
                          std::to_string(kMaxLayerPartLength) + " characters");
  }
  auto ok_first = lower_only ? isLower(part[0]) : isAlnum(part[0]);
  bool ok = ok_first;
  for (size_t i = 1; ok && i < part.size(); ++i) {
    char c = part[i];
    ok = (lower_only ? isLower(c) : isAlnum(c)) || isPunct(c);
  }
  if (!ok) {
    return Error::invalid("invalid layer " + std::string(what) + " '" + std::string(part) + "' " + ctx +
                          ": must match " + std::string(pattern));
  }
  return okStatus();
}

}  // namespace

Status validateLayerRef(const LayerRef& ref) {
  std::string whole = ref.name + ":" + ref.version;
  DSEC_TRY(checkPart(ref.name, "name", "[a-z0-9][a-z0-9._-]*", true, whole));
  DSEC_TRY(checkPart(ref.version, "version", "[A-Za-z0-9][A-Za-z0-9._-]*", false, whole));
  return okStatus();
}

Result<LayerRef> parseLayerRef(std::string_view text) {
  auto colon = text.find(':');
  if (colon == std::string_view::npos) {
    return Error::invalid("layer reference '" + std::string(text) + "' must be NAME:VERSION (e.g. debian:12)");
  }
  LayerRef ref{std::string(text.substr(0, colon)), std::string(text.substr(colon + 1))};
  if (ref.version.find(':') != std::string::npos) {
    return Error::invalid("layer reference '" + std::string(text) + "' has more than one ':' (want NAME:VERSION)");
  }
  DSEC_TRY(validateLayerRef(ref));
  return ref;
}

Result<std::vector<LayerRef>> parseImageRef(std::string_view text) {
  if (text.empty()) return Error::invalid("empty image reference (want NAME:VERSION[+NAME:VERSION...])");
  std::vector<LayerRef> layers;
  std::set<std::string> names;
  size_t start = 0;
  while (true) {
    size_t plus = text.find('+', start);
    std::string_view part = text.substr(start, plus == std::string_view::npos ? std::string_view::npos : plus - start);
    if (part.empty()) {
      return Error::invalid("image '" + std::string(text) + "' has an empty layer at position " +
                            std::to_string(layers.size() + 1) + " (layers are joined by a single '+')");
    }
    auto ref = parseLayerRef(part);
    if (!ref.ok()) return ref.error().wrap("image '" + std::string(text) + "'");
    // Two versions of one layer in a stack is never what was meant (the upper would shadow the lower).
    if (!names.insert(ref->name).second) {
      return Error::invalid("image '" + std::string(text) + "' lists layer '" + ref->name + "' more than once");
    }
    layers.push_back(std::move(ref).value());
    if (layers.size() > kMaxImageLayers) {
      return Error::invalid("image '" + std::string(text) + "' has more than " + std::to_string(kMaxImageLayers) +
                            " layers");
    }
    if (plus == std::string_view::npos) break;
    start = plus + 1;
  }
  return layers;
}

std::string imageToString(const std::vector<LayerRef>& layers) {
  std::string out;
  for (const auto& l : layers) {
    if (!out.empty()) out += '+';
    out += l.toString();
  }
  return out;
}

}  // namespace dsec::fs3
