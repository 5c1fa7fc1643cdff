// Attack: leave the node's agent with children it does not know of. Every command is the agent's child (so it can
// wait for it); a command that clones with CLONE_PARENT gives the agent more children, in the sandbox's pid
// namespace. Nothing reaps them: they stay zombies, and the sandbox's init, which on exit waits until every process
// of its namespace is reaped, never finishes dying. Repeated, that ate the node's pids and left every destroy
// failing. The test fails if such a child is made, if destroy does not finish, or if a zombie of ours is left.
#include <dirent.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include "../backends/container/ContainerTestSupport.h"
#include "dsec/common/Strings.h"

namespace dsec::testing {
namespace {

// Our children that are zombies (state Z in /proc/N/stat, parent us).
int zombieChildren() {
  int zombies = 0;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return -1;
  while (dirent* e = readdir(proc)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    auto stat = readFile(std::string("/proc/") + e->d_name + "/stat");
    if (!stat.ok()) continue;
    size_t close_paren = stat->rfind(')');
    if (close_paren == std::string::npos) continue;
    char state = 0;
    int ppid = 0;
    if (sscanf(stat->c_str() + close_paren + 1, " %c %d", &state, &ppid) == 2 && ppid == getpid() && state == 'Z') {
      ++zombies;
    }
  }
  closedir(proc);
  return zombies;
}

TEST_F(ContainerTest, ACommandCannotGiveTheAgentChildrenOfItsOwn) {
  auto& sb = create();
  auto cloner = readFile(DSEC_TEST_PARENT_CLONER);
  ASSERT_OK(cloner);
  {
    auto fd = sb.openForWrite("/tmp/cloner", 0755);
    ASSERT_OK(fd);
    ASSERT_EQ(::write(fd->get(), cloner->data(), cloner->size()), static_cast<ssize_t>(cloner->size()));
  }
  const int zombies_before = zombieChildren();
  // Run directly (no shell between): the command is the agent's own child.
  backends::ExecRequest request;
  request.argv = {"/tmp/cloner", "32"};
  request.timeout_seconds = 20;
  auto r = sb.exec(request);
  ASSERT_OK(r);
  int made = -1, err = 0;
  ASSERT_EQ(sscanf(r->stdout_data.c_str(), "made %d errno %d", &made, &err), 2) << r->stdout_data << r->stderr_data;
  EXPECT_EQ(made, 0) << "a command gave the agent " << made << " children of its own";
  EXPECT_EQ(zombieChildren() - zombies_before, 0) << "the agent holds zombies it never reaps";
  auto t0 = std::chrono::steady_clock::now();
  Status destroyed = sb.destroy();
  EXPECT_TRUE(destroyed.ok()) << "the sandbox's init could not finish dying: " << destroyed.error().toString();
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(took, 5.0);
}

}  // namespace
}  // namespace dsec::testing
