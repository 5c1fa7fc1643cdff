// What a sandbox must not see or touch: host processes, files, network, the layer, privileged syscalls.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <linux/capability.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <thread>

#include "ContainerTestSupport.h"
#include "dsec/common/Strings.h"

namespace dsec::testing {
namespace {

// Exec enters the sandbox from the calling thread: afterwards the thread must be back in every host
// namespace with the host root, and threads it creates later (which share its fs_struct) must work too.
std::string threadPlace() {
  std::string out;
  for (const char* ns : {"mnt", "pid", "net", "uts", "ipc", "cgroup", "pid_for_children"}) {
    char link[256] = {};
    ssize_t n = readlink((std::string("/proc/thread-self/ns/") + ns).c_str(), link, sizeof link - 1);
    out += std::string(ns) + "=" + (n > 0 ? std::string(link, static_cast<size_t>(n)) : "?") + " ";
  }
  struct stat root, cwd;
  if (::stat("/", &root) == 0 && ::stat(".", &cwd) == 0) {
    out += "root=" + std::to_string(root.st_dev) + ":" + std::to_string(root.st_ino);
    out += " cwd=" + std::to_string(cwd.st_dev) + ":" + std::to_string(cwd.st_ino);
  }
  return out;
}

TEST_F(ContainerTest, ExecLeavesTheCallingThreadAtHome) {
  auto& sb = create();
  const std::string home = threadPlace();
  EXPECT_EQ(sh(sb, "true").exit_code, 0);
  EXPECT_EQ(threadPlace(), home);
  // A thread created now shares this thread's fs_struct; both exec at once and both stay home.
  std::string other_before, other_after;
  int other_exit = -1;
  std::thread other([&] {
    other_before = threadPlace();
    other_exit = sh(sb, "echo x").exit_code;
    other_after = threadPlace();
  });
  for (int i = 0; i < 5; ++i) EXPECT_EQ(sh(sb, "true").exit_code, 0);
  other.join();
  EXPECT_EQ(other_exit, 0);
  EXPECT_EQ(other_after, other_before);
  EXPECT_EQ(threadPlace(), home);
  // The host still sees the host's files from this thread.
  EXPECT_EQ(access("/proc/self/exe", F_OK), 0);
  EXPECT_EQ(access(("/proc/" + std::to_string(getpid()) + "/status").c_str(), F_OK), 0);
}

TEST_F(ContainerTest, NoHostProcessesAndInitIsPid1) {
  auto& sb = create();
  auto ps = sh(sb, "ps -o pid,comm");
  ASSERT_EQ(ps.exit_code, 0) << ps.stderr_data;
  auto lines = split(trim(ps.stdout_data), '\n');
  // header, init, sh, ps
  EXPECT_LE(lines.size(), 4u) << ps.stdout_data;
  EXPECT_NE(ps.stdout_data.find("    1 dsec-sandbox-in"), std::string::npos) << ps.stdout_data;
  EXPECT_EQ(trim(sh(sb, "hostname").stdout_data), sb.spec().id);
  // The OOM killer spares init (it holds the sandbox), never the workload.
  // (Lowering it needs CAP_SYS_RESOURCE, which some CI containers do not grant.)
  bool can_protect = prctl(PR_CAPBSET_READ, CAP_SYS_RESOURCE, 0, 0, 0) == 1;
  EXPECT_EQ(sh(sb, "cat /proc/1/oom_score_adj /proc/self/oom_score_adj").stdout_data,
            can_protect ? "-1000\n0\n" : "0\n0\n");
  EXPECT_EQ(trim(sh(sb, "cat /proc/1/cgroup | grep -c ':/$'").stdout_data) != "0", true);
}

TEST_F(ContainerTest, NoHostFiles) {
  auto& sb = create();
  std::string marker = "/tmp/dsec-ct-marker-" + randomHex(8);
  ASSERT_OK(writeFile(marker, "host"));
  auto r = sh(sb, "test -e " + marker + " && echo visible || echo absent; ls /");
  unlink(marker.c_str());
  EXPECT_EQ(split(r.stdout_data, '\n')[0], "absent");
  EXPECT_EQ(r.stdout_data.find("sys\n"), std::string::npos);  // no /sys at all
  EXPECT_EQ(sh(sb, "ls /dev | tr '\\n' ' '").stdout_data,
            "fd full null ptmx pts random shm stderr stdin stdout tty urandom zero ");
}

TEST_F(ContainerTest, NoHostNetwork) {
  int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(listen(listener, 4), 0);
  socklen_t len = sizeof addr;
  getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  int port = ntohs(addr.sin_port);

  auto& sb = create();
  auto devs = sh(sb, "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '");
  EXPECT_EQ(devs.stdout_data, "lo\n");
  auto conn = sh(sb, "echo hi | nc -w 1 127.0.0.1 " + std::to_string(port) + " && echo connected", 10);
  EXPECT_EQ(conn.stdout_data.find("connected"), std::string::npos) << conn.stdout_data;
  // Loopback inside works: a listener in the sandbox is reachable from the sandbox.
  // Each round starts a listener, sends once and stops the listener, so neither a client that came too early
  // nor one whose data was lost can hang the test on a loaded machine.
  auto lo = sh(sb,
               "for i in $(seq 20); do "
               "  nc -l -p 7777 > /tmp/got & l=$!; usleep 100000; "
               "  echo ping | nc -w 1 127.0.0.1 7777 2>/dev/null; usleep 100000; "
               "  kill $l 2>/dev/null; wait $l 2>/dev/null; "
               "  [ \"$(cat /tmp/got)\" = ping ] && break; "
               "done; cat /tmp/got",
               30);
  EXPECT_EQ(lo.stdout_data, "ping\n");
  close(listener);
}

TEST_F(ContainerTest, LayerIsNotWritable) {
  auto& sb = create();
  auto r = sh(sb, "echo changed > /layer-file && cat /layer-file && rm /bin/ls && echo removed");
  EXPECT_EQ(r.stdout_data, "changed\nremoved\n");
  std::ifstream in(busyboxLayer().mount_dir + "/layer-file");
  std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(content, "from the layer\n");
  EXPECT_EQ(access((busyboxLayer().mount_dir + "/bin/ls").c_str(), F_OK), 0);
  // A second sandbox on the same layer sees the layer, not the first one's changes.
  auto& other = create();
  EXPECT_EQ(sh(other, "cat /layer-file").stdout_data, "from the layer\n");
}

TEST_F(ContainerTest, SeccompAndCapabilities) {
  auto& sb = create();
  auto m = sh(sb, "mkdir -p /mnt/x; mount -t tmpfs none /mnt/x; echo rc=$?");
  EXPECT_NE(m.stdout_data.find("rc=1"), std::string::npos) << m.stdout_data << m.stderr_data;
  EXPECT_NE(m.stderr_data.find("permission denied"), std::string::npos) << m.stderr_data;
  auto u = sh(sb, "unshare -n true; echo rc=$?");
  EXPECT_EQ(u.stdout_data, "rc=1\n") << u.stderr_data;
  auto ns = sh(sb, "nsenter -t 1 -m true; echo rc=$?");
  EXPECT_EQ(ns.stdout_data, "rc=1\n") << ns.stderr_data;
  auto mk = sh(sb, "mknod /tmp/sda b 8 0; echo rc=$?");  // no CAP_MKNOD: no raw host disks
  EXPECT_EQ(mk.stdout_data, "rc=1\n");
  auto status = sh(sb, "grep -E '^(CapBnd|CapEff|NoNewPrivs|Seccomp):' /proc/self/status");
  // Docker's default set without CAP_MKNOD and CAP_NET_RAW.
  EXPECT_NE(status.stdout_data.find("CapBnd:\t00000000a00405fb"), std::string::npos) << status.stdout_data;
  EXPECT_NE(status.stdout_data.find("CapEff:\t00000000a00405fb"), std::string::npos) << status.stdout_data;
  EXPECT_NE(status.stdout_data.find("NoNewPrivs:\t1"), std::string::npos);
  EXPECT_NE(status.stdout_data.find("Seccomp:\t2"), std::string::npos);
  // /proc knobs that act on the host are masked or read-only.
  auto sys = sh(sb,
                "echo 1 > /proc/sys/vm/drop_caches; echo rc=$?; wc -c < /proc/timer_list; "
                "grep -c -E ' /proc/(sys|keys|timer_list|kpageflags) ' /proc/self/mountinfo");
  EXPECT_EQ(sys.stdout_data, "rc=1\n0\n4\n") << sys.stderr_data;
  EXPECT_NE(sys.stderr_data.find("Read-only"), std::string::npos) << sys.stderr_data;
}

}  // namespace
}  // namespace dsec::testing
