#include "dsec/placement/CpuList.h"

#include <algorithm>
#include <charconv>

namespace dsec::placement {

std::string formatCpuList(std::vector<int> ids) {
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  std::string out;
  for (size_t i = 0; i < ids.size();) {
    size_t j = i;
    while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(ids[i]);
    if (j > i) out += '-' + std::to_string(ids[j]);
    i = j + 1;
  }
  return out;
}

namespace {

bool parseInt(std::string_view text, int& value) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) text.remove_suffix(1);
  if (text.empty()) return false;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  return ec == std::errc() && ptr == text.data() + text.size() && value >= 0;
}

}  // namespace

Result<std::vector<int>> parseCpuList(std::string_view text) {
  std::string_view rest = text;
  while (!rest.empty() && (rest.back() == '\n' || rest.back() == ' ')) rest.remove_suffix(1);
  std::vector<int> ids;
  if (rest.empty()) return ids;
  // A range wider than this is a typo, not a machine.
  constexpr int kMaxRange = 1 << 20;
  while (true) {
    size_t comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    size_t dash = item.find('-');
    int lo = 0;
    int hi = 0;
    bool ok = dash == std::string_view::npos
                  ? (parseInt(item, lo) && (hi = lo, true))
                  : (parseInt(item.substr(0, dash), lo) && parseInt(item.substr(dash + 1), hi));
    if (!ok || hi < lo || hi - lo > kMaxRange) {
      return Error::invalid("bad cpu list '" + std::string(text) + "': item '" + std::string(item) + "'");
    }
    for (int i = lo; i <= hi; ++i) ids.push_back(i);
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

}  // namespace dsec::placement
