// Who is on the other end of an accepted TCP connection, as the per-client connection budget counts it
// (docs/node-agent.md, "Connection budgets"). On a Slurm node every local user can connect from any address
// of 127.0.0.0/8 (or from any of the node's own addresses), so a local peer is identified by the user id that
// owns its socket, which the kernel reports through sock_diag; a remote peer by its address (IPv6: its /64,
// which one host usually controls whole).
#pragma once

#include <sys/socket.h>

#include <optional>
#include <string>

namespace dsec::launcher {

// The owner uid of the local socket at the other end of connection `fd` (a TCP connection between two of this
// host's addresses in this network namespace), or nullopt when the peer is remote or cannot be looked up.
std::optional<uint32_t> localPeerUid(int fd);

// "uid:1000" for a local peer, else "ip:10.0.0.7" / "ip6:2001:db8:1:2::/64".
std::string clientKeyOf(int fd);

// The address part alone (for tests): "ip:..." or "ip6:.../64" from a peer address.
std::string addressKey(const struct sockaddr_storage& peer);

}  // namespace dsec::launcher
