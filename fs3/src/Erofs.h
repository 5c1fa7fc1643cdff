// mkfs.erofs and image hashing for the layer store (internal).
#pragma once

#include <cstdint>
#include <string>

#include "dsec/common/Result.h"

namespace dsec::fs3 {

// Makes an uncompressed EROFS image of dir at image (which must not exist). Keeps ownership, modes, mtimes,
// xattrs (trusted.overlay.opaque) and device nodes (overlay whiteouts are char 0/0 devices).
Status makeErofsImage(const std::string& dir, const std::string& image);

struct FileDigest {
  std::string sha256;  // lowercase hex
  int64_t size = 0;
};
// fsyncs the file (it is about to be published) and hashes it.
Result<FileDigest> syncAndHashFile(const std::string& path);

}  // namespace dsec::fs3
