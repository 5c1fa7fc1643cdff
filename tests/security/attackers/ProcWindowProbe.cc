// An attacker run as root inside a sandbox: it predicts the pid of the next process the node starts inside (the
// pid namespace hands them out in order) and keeps opening that pid's (and the newest one's) /proc files that need
// no ptrace access (net/dev, mountinfo, net/unix), hoping to catch a command in the moment after it appears in the
// sandbox's pid namespace and before it has joined the sandbox's other namespaces. Whatever those files show that the
// sandbox's own namespaces do not (a network interface, a mount point, a unix socket path) belongs to the namespaces
// the command came from: the node's. Static, so it runs in any image.
//
//   dsec-test-proc-window-probe STOP_FILE
// Prints "iface NAME", "mount PATH" and "unix PATH" once for each foreign one it saw and, when STOP_FILE appears,
// "tries N caught M" (M: how many processes it got the files of) and exits.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <vector>

namespace {

std::string readAll(int fd) {
  std::string out;
  char buf[16384];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

std::string readPath(const char* path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  std::string s = readAll(fd);
  close(fd);
  return s;
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < text.size()) {
    size_t nl = text.find('\n', at);
    if (nl == std::string::npos) nl = text.size();
    out.push_back(text.substr(at, nl - at));
    at = nl + 1;
  }
  return out;
}

// Interface names of a /proc/net/dev table.
std::set<std::string> interfaces(const std::string& table) {
  std::set<std::string> out;
  for (const auto& l : lines(table)) {
    size_t colon = l.find(':');
    if (colon == std::string::npos) continue;
    size_t start = l.find_first_not_of(' ');
    if (start < colon) out.insert(l.substr(start, colon - start));
  }
  return out;
}

// Mount points (field 5) of a mountinfo table.
std::set<std::string> mountPoints(const std::string& table) {
  std::set<std::string> out;
  for (const auto& l : lines(table)) {
    size_t pos = 0;
    for (int field = 0; field < 4 && pos != std::string::npos; ++field) pos = l.find(' ', pos + 1);
    if (pos == std::string::npos) continue;
    size_t end = l.find(' ', pos + 1);
    out.insert(l.substr(pos + 1, end == std::string::npos ? std::string::npos : end - pos - 1));
  }
  return out;
}

// Bound paths (the last field, when there is one) of a /proc/net/unix table.
std::set<std::string> unixPaths(const std::string& table) {
  std::set<std::string> out;
  for (const auto& l : lines(table)) {
    size_t sp = l.rfind(' ');
    if (sp == std::string::npos || sp + 1 >= l.size()) continue;
    std::string p = l.substr(sp + 1);
    if (p[0] == '/' || p[0] == '@') out.insert(p);
  }
  return out;
}

// Reports every name in seen that is neither one of ours nor reported before.
void report(const char* kind, const std::set<std::string>& seen, const std::set<std::string>& ours,
            std::set<std::string>* reported) {
  for (const auto& name : seen) {
    if (ours.count(name) != 0 || !reported->insert(name).second) continue;
    printf("%s %s\n", kind, name.c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s STOP_FILE\n", argv[0]);
    return 2;
  }
  setvbuf(stdout, nullptr, _IOLBF, 0);
  const char* stop_file = argv[1];
  const std::set<std::string> our_ifaces = interfaces(readPath("/proc/self/net/dev"));
  const std::set<std::string> our_mounts = mountPoints(readPath("/proc/self/mountinfo"));
  std::set<std::string> reported_ifaces, reported_mounts, reported_unix;
  long tries = 0;
  std::set<int> caught;
  int last_pid_fd = open("/proc/sys/kernel/ns_last_pid", O_RDONLY | O_CLOEXEC);
  if (last_pid_fd < 0) return 3;
  while (access(stop_file, F_OK) != 0) {
    for (int round = 0; round < 256; ++round) {
      char buf[32] = {};
      if (pread(last_pid_fd, buf, sizeof buf - 1, 0) <= 0) return 3;
      // The newest process (a command caught later in its start), and the next one, opened the moment it exists.
      const int pid = atoi(buf) + (round % 2);
      if (pid == getpid()) continue;
      char path[64];
      ++tries;
      snprintf(path, sizeof path, "/proc/%d/net/dev", pid);
      int net = open(path, O_RDONLY | O_CLOEXEC);
      if (net < 0) continue;
      snprintf(path, sizeof path, "/proc/%d/mountinfo", pid);
      int mounts = open(path, O_RDONLY | O_CLOEXEC);
      snprintf(path, sizeof path, "/proc/%d/net/unix", pid);
      int unix_table = open(path, O_RDONLY | O_CLOEXEC);
      caught.insert(pid);
      report("iface", interfaces(readAll(net)), our_ifaces, &reported_ifaces);
      close(net);
      if (mounts >= 0) {
        report("mount", mountPoints(readAll(mounts)), our_mounts, &reported_mounts);
        close(mounts);
      }
      if (unix_table >= 0) {
        report("unix", unixPaths(readAll(unix_table)), {}, &reported_unix);
        close(unix_table);
      }
    }
  }
  printf("tries %ld caught %zu\n", tries, caught.size());
  return 0;
}
