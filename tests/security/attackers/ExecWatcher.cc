// The attacker of the exec-window test, run as root inside a sandbox: it watches /proc for every new process,
// SIGSTOPs it at once, and while stepping it with SIGCONT/SIGSTOP tries to open /proc/N/mem and read every
// readable region of /proc/N/maps, looking for a secret (the node's token, given reversed on the command line so
// its plain form exists only in this process). It is how a process inside read the agent's memory when execs
// were cloned sharing it. Static, so it runs in any image.
//
//   dsec-test-exec-watcher REVERSED_SECRET STOP_FILE
// Prints "found PID" for every process whose memory held the secret and, when STOP_FILE appears,
// "seen N stopped M mem_opened K" and exits.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <vector>

namespace {

bool regionHas(int mem_fd, unsigned long start, unsigned long end, const std::string& secret) {
  std::vector<char> buf(1 << 20);
  std::string carry;
  for (unsigned long at = start; at < end;) {
    size_t want = std::min<unsigned long>(buf.size(), end - at);
    ssize_t n = pread(mem_fd, buf.data(), want, static_cast<off_t>(at));
    if (n <= 0) return false;
    std::string chunk = carry + std::string(buf.data(), static_cast<size_t>(n));
    if (chunk.find(secret) != std::string::npos) return true;
    carry = chunk.substr(chunk.size() > secret.size() ? chunk.size() - secret.size() : 0);
    at += static_cast<unsigned long>(n);
  }
  return false;
}

// Reads every readable region of pid's memory; true if the secret is there. Counts an open of /proc/N/mem.
bool memoryHas(int pid, const std::string& secret, int* opened) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/mem", pid);
  int mem = open(path, O_RDONLY | O_CLOEXEC);
  if (mem < 0) return false;
  ++*opened;
  snprintf(path, sizeof path, "/proc/%d/maps", pid);
  FILE* maps = fopen(path, "re");
  bool found = false;
  if (maps != nullptr) {
    char line[512];
    while (!found && fgets(line, sizeof line, maps) != nullptr) {
      unsigned long start = 0, end = 0;
      char perms[8] = {};
      if (sscanf(line, "%lx-%lx %7s", &start, &end, perms) != 3 || perms[0] != 'r') continue;
      if (strstr(line, "[vvar]") != nullptr) continue;
      found = regionHas(mem, start, end, secret);
    }
    fclose(maps);
  }
  close(mem);
  return found;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s REVERSED_SECRET STOP_FILE\n", argv[0]);
    return 2;
  }
  std::string secret(argv[1]);
  std::reverse(secret.begin(), secret.end());
  memset(argv[1], 'x', strlen(argv[1]));
  const char* stop_file = argv[2];
  const int self = getpid();
  std::set<int> seen;
  int stopped = 0, opened = 0;
  setvbuf(stdout, nullptr, _IOLBF, 0);
  while (access(stop_file, F_OK) != 0) {
    DIR* proc = opendir("/proc");
    if (proc == nullptr) return 3;
    std::vector<int> fresh;
    while (dirent* e = readdir(proc)) {
      int pid = atoi(e->d_name);
      if (pid <= 1 || pid == self || seen.count(pid) != 0) continue;
      fresh.push_back(pid);
    }
    closedir(proc);
    for (int pid : fresh) {
      seen.insert(pid);
      if (kill(pid, SIGSTOP) == 0) ++stopped;
      // Step it: at every stop, try its memory (its credentials may have changed since the last try); the first
      // time it opens, read all of it.
      bool found = false;
      const int opened_before = opened;
      for (int step = 0; step < 200 && opened == opened_before; ++step) {
        found = memoryHas(pid, secret, &opened);
        kill(pid, SIGCONT);
        kill(pid, SIGSTOP);
      }
      kill(pid, SIGCONT);
      if (found) printf("found %d\n", pid);
    }
  }
  printf("seen %zu stopped %d mem_opened %d\n", seen.size(), stopped, opened);
  return 0;
}
