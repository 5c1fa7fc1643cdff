// Small parsing and formatting helpers shared by the CLI, the API and the stores.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dsec/common/Result.h"

namespace dsec {

// "512M", "1G", "1.5GiB", "1048576", "64k" -> bytes. Suffixes are binary (K=1024). Rejects negatives,
// garbage and overflow with a message naming the input.
Result<int64_t> parseByteSize(std::string_view text);
std::string formatBytes(int64_t bytes);
std::vector<std::string> split(std::string_view text, char sep);
std::string trim(std::string_view text);
bool startsWith(std::string_view text, std::string_view prefix);
// Random lowercase hex of the given length from getrandom().
std::string randomHex(size_t length);
// Reads a whole (small) file; errors carry errno and the path.
Result<std::string> readFile(const std::string& path);
// Writes via a temp file + fsync + rename so readers never see half a file.
Status writeFileAtomic(const std::string& path, std::string_view contents, int mode = 0644);
Status writeFile(const std::string& path, std::string_view contents);
// mkdir -p with the given mode for created dirs.
Status makeDirs(const std::string& path, int mode = 0755);
// rm -rf that never crosses a mount point (a safety net for sandbox dirs); missing path is ok.
Status removeTree(const std::string& path);
// Monotonic seconds.
double monotonicSeconds();

}  // namespace dsec
