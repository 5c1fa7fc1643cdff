// dsec bench create --backend microvm|vm (BenchMachineCreate.cc); `dsec bench create` parses the options.
#pragma once

#include <cstdint>
#include <string>

#include "BenchSupport.h"

namespace dsec::cli {

struct MachineCreateOptions {
  BenchTargetOptions target;
  std::string backend;       // microvm | vm
  int count = 10;            // samples of each kind
  int64_t memory_bytes = 0;  // guest RAM (0: the node's default)
};

int benchMachineCreate(const Invocation& inv, const MachineCreateOptions& options);

}  // namespace dsec::cli
