// dsec-spank-test-layer ROOT NAME:VERSION DIR: builds a layer into the store at ROOT from DIR (the Slurm tests'
// busybox image), or does nothing if it exists. A tiny stand-in for `dsec layer build` that depends on fs3 only.
#include <cstdio>

#include "dsec/fs3/LayerRef.h"
#include "dsec/fs3/LayerStore.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s ROOT NAME:VERSION DIR\n", argv[0]);
    return 2;
  }
  auto ref = dsec::fs3::parseLayerRef(argv[2]);
  if (!ref.ok()) {
    std::fprintf(stderr, "%s\n", ref.error().message().c_str());
    return 2;
  }
  dsec::fs3::LayerStore store(argv[1]);
  if (auto s = store.init(); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.error().message().c_str());
    return 1;
  }
  if (store.exists(*ref)) return 0;
  auto built = store.buildFromDir(*ref, argv[3], "", std::string("dir:") + argv[3]);
  if (!built.ok()) {
    std::fprintf(stderr, "%s\n", built.error().message().c_str());
    return 1;
  }
  std::printf("built %s (%lld bytes)\n", ref->toString().c_str(), static_cast<long long>(built->size));
  return 0;
}
