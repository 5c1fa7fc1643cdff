// dsec-sandbox-init: the sandbox's network, set up from inside its network namespace: loopback, and for network
// egress the address and default route of eth0 (the veth the agent made).
#include <arpa/inet.h>
#include <errno.h>
#include <net/if.h>
#include <net/route.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "InitSupport.h"

namespace dsec::backends::sandbox_init {
namespace {

bool parseIp(const char* text, in_addr* out) { return inet_pton(AF_INET, text, out) == 1; }

void setAddress(int fd, unsigned long request, const char* ifname, const char* text) {
  struct ifreq ifr;
  memset(&ifr, 0, sizeof ifr);
  strncpy(ifr.ifr_name, ifname, IFNAMSIZ - 1);
  auto* sin = reinterpret_cast<sockaddr_in*>(&ifr.ifr_addr);
  sin->sin_family = AF_INET;
  if (!parseIp(text, &sin->sin_addr)) fail("egress", EINVAL, "bad address");
  check("egress", ioctl(fd, request, &ifr), "set address of eth0");
}

}  // namespace

// Network egress: eth0 (the agent made it, the node end is the gateway) gets its address and the default route.
void egressUp() {
  step("egress");
  if (g_cfg.network != Network::kEgress) return;
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  check("egress", fd, "socket");
  setAddress(fd, SIOCSIFADDR, "eth0", g_cfg.egress_address);
  setAddress(fd, SIOCSIFNETMASK, "eth0", g_cfg.egress_netmask);
  struct ifreq ifr;
  memset(&ifr, 0, sizeof ifr);
  memcpy(ifr.ifr_name, "eth0", 5);
  check("egress", ioctl(fd, SIOCGIFFLAGS, &ifr), "SIOCGIFFLAGS eth0");
  ifr.ifr_flags = static_cast<short>(ifr.ifr_flags | IFF_UP | IFF_RUNNING);
  check("egress", ioctl(fd, SIOCSIFFLAGS, &ifr), "SIOCSIFFLAGS eth0");
  struct rtentry route;
  memset(&route, 0, sizeof route);
  auto* dst = reinterpret_cast<sockaddr_in*>(&route.rt_dst);
  auto* gw = reinterpret_cast<sockaddr_in*>(&route.rt_gateway);
  auto* mask = reinterpret_cast<sockaddr_in*>(&route.rt_genmask);
  dst->sin_family = gw->sin_family = mask->sin_family = AF_INET;
  if (!parseIp(g_cfg.egress_gateway, &gw->sin_addr)) fail("egress", EINVAL, "bad gateway");
  route.rt_flags = RTF_UP | RTF_GATEWAY;
  char dev[] = "eth0";
  route.rt_dev = dev;
  check("egress", ioctl(fd, SIOCADDRT, &route), "add the default route");
  close(fd);
}

void loopbackUp() {
  step("loopback");
  if (g_cfg.network == Network::kHost) return;
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  check("loopback", fd, "socket");
  struct ifreq ifr;
  memset(&ifr, 0, sizeof ifr);
  memcpy(ifr.ifr_name, "lo", 3);
  check("loopback", ioctl(fd, SIOCGIFFLAGS, &ifr), "SIOCGIFFLAGS lo");
  ifr.ifr_flags = static_cast<short>(ifr.ifr_flags | IFF_UP | IFF_RUNNING);
  check("loopback", ioctl(fd, SIOCSIFFLAGS, &ifr), "SIOCSIFFLAGS lo");
  close(fd);
}

}  // namespace dsec::backends::sandbox_init
