// PROVISIONAL (replaced by the guest side's header).
#pragma once
#include <string>
#include "dsec/common/Result.h"
namespace dsec::backends::vm {
Status writeInitramfs(const std::string& out_path, const std::string& agent_path, const std::string& kernel_dir);
Result<std::string> findGuestKernelDir();
Result<std::string> findGuestAgent();
}  // namespace dsec::backends::vm
