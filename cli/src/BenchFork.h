// dsec bench fork: the options `dsec bench fork` parses (BenchFork.cc) and the two runs, machine sandboxes
// (BenchFork.cc) and containers (BenchForkContainer.cc).
#pragma once

#include <cstdint>
#include <string>

#include "BenchSupport.h"

namespace dsec::cli {

struct ForkBenchOptions {
  BenchTargetOptions target;
  std::string backend;       // microvm | vm | container
  int count = 0;             // copies per fork
  int64_t memory_bytes = 0;  // microvm|vm: guest RAM (0: the node's default)
  int workspace_mib = 200;   // container: the source's workspace
  int workspace_files = 8;   // ... in this many files
};

int benchForkMachine(const Invocation& inv, const ForkBenchOptions& options);
int benchForkContainer(const Invocation& inv, const ForkBenchOptions& options);

}  // namespace dsec::cli
