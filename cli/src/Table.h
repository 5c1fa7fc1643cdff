// Column-aligned text tables for `dsec ls` and `dsec layer ls`, and the small formatters they use.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace dsec::cli {

class Table {
 public:
  explicit Table(std::vector<std::string> header) { rows_.push_back(std::move(header)); }
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  void print(std::ostream& out) const;

 private:
  std::vector<std::vector<std::string>> rows_;
};

// 42 -> "42s", 600 -> "10m", 7200 -> "2h", 3 days -> "3d".
std::string formatAge(double seconds);

}  // namespace dsec::cli
