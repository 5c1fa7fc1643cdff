// A newc cpio archive (what the kernel unpacks as an initramfs) written entry by entry to an fd: the machine
// backends' initramfs, and the plain-QEMU peer of `dsec bench create --backend microvm`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "dsec/common/Result.h"

namespace dsec::backends::vm {

class CpioWriter {
 public:
  explicit CpioWriter(int fd) : fd_(fd) {}
  // mode holds the type bits (S_IFDIR, S_IFREG, S_IFCHR...) and the permissions.
  Status add(const std::string& name, uint32_t mode, const std::string& data, uint32_t rdev_major = 0,
             uint32_t rdev_minor = 0);
  // The trailer; the archive is complete after it.
  Status finish();

 private:
  Status write(const std::string& bytes);
  int fd_;
  uint32_t next_ino_ = 1;
  size_t written_ = 0;
};

}  // namespace dsec::backends::vm
