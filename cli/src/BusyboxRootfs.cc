#include "BusyboxRootfs.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "dsec/common/Process.h"
#include "dsec/common/Strings.h"

namespace dsec::cli {

Status writeBusyboxRootfs(const std::string& dir) {
  std::string busybox = "/bin/busybox";
  if (access(busybox.c_str(), X_OK) != 0) busybox = findProgram("busybox");
  if (busybox.empty() || access(busybox.c_str(), X_OK) != 0) {
    return Error(ErrorCode::kUnsupported, "busybox not found (apt-get install busybox-static)");
  }
  for (const char* sub : {"bin", "sbin", "usr/bin", "usr/sbin", "etc", "dev", "proc", "sys", "tmp", "root", "work"}) {
    DSEC_TRY(makeDirs(dir + "/" + sub, 0755));
  }
  if (chmod((dir + "/tmp").c_str(), 01777) != 0) return Error::sys(errno, "chmod " + dir + "/tmp");
  DSEC_TRY(runCommandChecked({"cp", busybox, dir + "/bin/busybox"}));
  DSEC_ASSIGN_OR_RETURN(std::string applets, runCommandChecked({busybox, "--list-full"}));
  for (const auto& line : split(applets, '\n')) {
    std::string applet = trim(line);  // "bin/ls", "usr/bin/env"
    if (applet.empty() || applet == "bin/busybox") continue;
    std::string path = dir + "/" + applet;
    int depth = static_cast<int>(std::count(applet.begin(), applet.end(), '/'));
    std::string target;
    for (int i = 0; i < depth; ++i) target += "../";
    target += "bin/busybox";
    auto slash = path.rfind('/');
    DSEC_TRY(makeDirs(path.substr(0, slash), 0755));
    if (symlink(target.c_str(), path.c_str()) != 0 && errno != EEXIST) return Error::sys(errno, "symlink " + path);
  }
  DSEC_TRY(writeFile(dir + "/etc/passwd", "root:x:0:0:root:/root:/bin/sh\n"));
  DSEC_TRY(writeFile(dir + "/etc/group", "root:x:0:\n"));
  DSEC_TRY(writeFile(dir + "/etc/motd", "dsec busybox layer\n"));
  return okStatus();
}

}  // namespace dsec::cli
