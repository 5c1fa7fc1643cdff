// What the parts of dsec-sandbox-init share: its config, its static buffers, the helpers that report a failed
// step, and the steps each part provides. C-style like all of init (see SandboxInit.cc).
#pragma once

#include <linux/filter.h>
#include <stddef.h>
#include <sys/types.h>

#include "../src/InitProtocol.h"

namespace dsec::backends::sandbox_init {

namespace proto = dsec::backends::init_protocol;

enum class Network { kNone, kEgress, kHost };

struct Config {
  const char* fail_at = "";
  const char* hostname = "sandbox";
  const char* scratch = nullptr;
  int nlowers = 0;         // the first nlowers received fds: layer mounts, bottom first
  bool has_upper = false;  // the next received fd: the host directory holding upper/ and work/
  long long disk_bytes = 0;
  Network network = Network::kNone;
  bool read_only_root = false;
  const char* egress_address = nullptr;  // network egress: eth0's address, the node end, the netmask
  const char* egress_gateway = nullptr;
  const char* egress_netmask = nullptr;
  const char* nameserver = nullptr;  // network egress: the node's resolver; /etc/resolv.conf names only it
  const sock_filter* bpf = nullptr;
  int bpf_len = 0;
};

// Static buffers: zero pages until touched, so an idle init costs only what it used.
extern int g_fds[proto::kMaxLowers + 1];  // the mounts the agent passed with the config, in order
extern int g_nfds;
extern char g_path[4096];  // joinPath's result
extern char g_opts[8192];  // mount options being put together
extern Config g_cfg;

size_t appendStr(char* buf, size_t pos, size_t cap, const char* s);
size_t appendNum(char* buf, size_t pos, size_t cap, long long v);
void writeAll(int fd, const char* data, size_t len);
// Reports "err STEP ERRNO WHAT" on the status fd and exits.
[[noreturn]] void fail(const char* step, int err, const char* what);
// Fails the step if the test harness armed a fault there.
void step(const char* name);
void check(const char* step_name, int rc, const char* what);
// a/b, in g_path (valid until the next call).
const char* joinPath(const char* a, const char* b);
int mkdirIfMissing(const char* path, mode_t mode);

// The root file system (InitRoot.cc): mountRoot returns the directory that pivotInto makes the root.
const char* mountRoot();
void mountDev(const char* root);
void mountProc(const char* root);
void bindEtc(const char* root);
void pivotInto(const char* root);

// The network (InitNetwork.cc).
void loopbackUp();
void egressUp();

}  // namespace dsec::backends::sandbox_init
