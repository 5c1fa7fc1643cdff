#include "dsec/backends/vm/Cpio.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

namespace dsec::backends::vm {

// newc: "070701", then 13 eight-digit hex fields, the name (NUL-terminated) and the data, each padded to 4 bytes.
Status CpioWriter::add(const std::string& name, uint32_t mode, const std::string& data, uint32_t rdev_major,
                       uint32_t rdev_minor) {
  char header[111];
  snprintf(header, sizeof header, "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X", next_ino_++, mode, 0u,
           0u, S_ISDIR(mode) ? 2u : 1u, 0u, static_cast<uint32_t>(data.size()), 0u, 0u, rdev_major, rdev_minor,
           static_cast<uint32_t>(name.size() + 1), 0u);
  std::string out(header, 110);
  out += name;
  out.push_back('\0');
  while ((written_ + out.size()) % 4 != 0) out.push_back('\0');
  out += data;
  while ((written_ + out.size()) % 4 != 0) out.push_back('\0');
  return write(out);
}

Status CpioWriter::finish() { return add("TRAILER!!!", 0, ""); }

Status CpioWriter::write(const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd_, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Error::sys(errno, "writing a cpio archive");
    done += static_cast<size_t>(n);
  }
  written_ += bytes.size();
  return okStatus();
}

}  // namespace dsec::backends::vm
