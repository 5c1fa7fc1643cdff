// dsec-bench-placement: fill a simulated cell through the real placement code and report the spread.
// Human summary first; the last line is one JSON object (decisions_per_second, max_over_mean, rejected, ...).
#include <string>
#include <vector>

#include "dsec/placement/PlacementBench.h"

int main(int argc, char** argv) {
  return dsec::placement::placementBenchMain("dsec-bench-placement", std::vector<std::string>(argv + 1, argv + argc));
}
