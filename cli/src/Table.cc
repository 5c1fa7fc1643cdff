#include "Table.h"

#include <algorithm>

namespace dsec::cli {

void Table::print(std::ostream& out) const {
  std::vector<size_t> widths;
  for (const auto& row : rows_) {
    if (widths.size() < row.size()) widths.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  }
  for (const auto& row : rows_) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(widths[i] - row[i].size() + 2, ' ');
    }
    out << line << "\n";
  }
}

std::string formatAge(double seconds) {
  if (seconds < 0) seconds = 0;
  auto whole = static_cast<long long>(seconds);
  if (whole < 120) return std::to_string(whole) + "s";
  if (whole < 7200) return std::to_string(whole / 60) + "m";
  if (whole < 2LL * 86400) return std::to_string(whole / 3600) + "h";
  return std::to_string(whole / 86400) + "d";
}

}  // namespace dsec::cli
