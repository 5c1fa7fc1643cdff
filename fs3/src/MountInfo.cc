#include "dsec/fs3/MountInfo.h"

#include <sstream>

#include "dsec/common/Strings.h"

namespace dsec::fs3 {
namespace {

// mountinfo escapes space, tab, newline and backslash as a backslash and three octal digits.
std::string unescape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '7' && s[i + 2] >= '0' && s[i + 2] <= '7' &&
        s[i + 3] >= '0' && s[i + 3] <= '7') {
      out += static_cast<char>((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0'));
      i += 3;
    } else {
      out += s[i];
    }
  }
  return out;
}

}  // namespace

Result<std::vector<MountEntry>> readMountInfo(const std::string& path) {
  DSEC_ASSIGN_OR_RETURN(std::string text, readFile(path));
  std::vector<MountEntry> out;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    // id parent major:minor root mount_point options [optional fields...] - fstype source super_options
    std::istringstream in(line);
    std::vector<std::string> fields;
    std::string f;
    while (in >> f) fields.push_back(f);
    size_t dash = 0;
    for (size_t i = 6; i < fields.size(); ++i) {
      if (fields[i] == "-") {
        dash = i;
        break;
      }
    }
    if (fields.size() < 6 || dash == 0 || dash + 2 >= fields.size()) continue;
    out.push_back({unescape(fields[4]), fields[dash + 1], unescape(fields[dash + 2]), fields[5]});
  }
  return out;
}

Result<std::vector<MountEntry>> mountsUnder(const std::string& dir) {
  DSEC_ASSIGN_OR_RETURN(auto all, readMountInfo());
  std::string prefix = dir;
  while (prefix.size() > 1 && prefix.back() == '/') prefix.pop_back();
  std::vector<MountEntry> out;
  for (auto& m : all) {
    if (m.mount_point == prefix || startsWith(m.mount_point, prefix == "/" ? prefix : prefix + "/")) {
      out.push_back(std::move(m));
    }
  }
  return out;
}

}  // namespace dsec::fs3
