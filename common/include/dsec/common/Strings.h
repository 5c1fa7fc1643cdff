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
// Lowercase hex of bytes (digests, MACs).
std::string hexEncode(std::string_view bytes);
// RFC 3986 percent-encoding of a URL component: unreserved characters stay, and '/' too when keep_slash (a path
// in a query value stays readable).
std::string percentEncode(std::string_view text, bool keep_slash = false);
// "2026-12-07T12:00:00Z": UTC, whole seconds.
std::string rfc3339(double unix_seconds);
// Reads a whole (small) file; errors carry errno and the path.
Result<std::string> readFile(const std::string& path);
// A file only this user may have written: refused (kConflict, saying why) unless it is a regular file, not a
// symbolic link, owned by the effective uid with no group or other permission bits, in a directory no other
// user could have replaced it in (owned by this user or root, not group/other writable unless sticky). For
// tokens and settings a privileged process reads from a state directory.
Result<std::string> readPrivateFile(const std::string& path);
// Creates path (and its parents) as a directory only this user may use: an existing one that is a symbolic link
// or belongs to another uid is refused (kConflict), one of this user's with group/other bits becomes 0700.
Status makePrivateDir(const std::string& path);
// How long an atomic write must last. kSurvivesPowerLoss fsyncs the file before the rename. kSurvivesAgentCrash
// skips that: for files that only matter while processes of this boot live (a sandbox's state: no power loss
// leaves the sandbox to re-adopt), where an fsync would only slow the path that writes them.
enum class Durability { kSurvivesPowerLoss, kSurvivesAgentCrash };
// Writes via a temp file (".tmp-" + random, created exclusively with `mode`) + rename, so readers never see
// half a file; the temp file is removed on failure.
Status writeFileAtomic(const std::string& path, std::string_view contents, int mode = 0644,
                       Durability durability = Durability::kSurvivesPowerLoss);
Status writeFile(const std::string& path, std::string_view contents);
// mkdir -p with the given mode for created dirs.
Status makeDirs(const std::string& path, int mode = 0755);
// rm -rf that never crosses a mount point (a safety net for sandbox dirs); missing path is ok.
Status removeTree(const std::string& path);
// Monotonic seconds.
double monotonicSeconds();

}  // namespace dsec
