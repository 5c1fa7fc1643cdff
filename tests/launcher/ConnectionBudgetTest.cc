// The per-client connection budget and how clients are told apart: local peers by the uid owning their
// socket (whatever loopback address they use), remote ones by address (IPv6 by /64).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "dsec/common/Fd.h"
#include "dsec/launcher/api/ClientKey.h"
#include "dsec/launcher/api/ConnectionBudget.h"

namespace dsec::launcher {
namespace {

TEST(ConnectionBudgetTest, CountsPerClient) {
  ClientConnectionBudget budget(2, 100);
  EXPECT_TRUE(budget.tryTake("uid:1000"));
  EXPECT_TRUE(budget.tryTake("uid:1000"));
  EXPECT_FALSE(budget.tryTake("uid:1000"));
  EXPECT_TRUE(budget.tryTake("ip:10.0.0.7"));
  EXPECT_EQ(budget.count("uid:1000"), 2);
  EXPECT_EQ(budget.total(), 3);
  budget.give("uid:1000");
  EXPECT_TRUE(budget.tryTake("uid:1000"));
  budget.give("nobody-here");  // harmless
  EXPECT_EQ(budget.total(), 3);
}

TEST(ConnectionBudgetTest, AllClientsTogetherHaveABudgetToo) {
  ClientConnectionBudget budget(2, 3);
  EXPECT_TRUE(budget.tryTake("uid:1"));
  EXPECT_TRUE(budget.tryTake("uid:2"));
  EXPECT_TRUE(budget.tryTake("uid:3"));
  EXPECT_FALSE(budget.tryTake("uid:4"));
  EXPECT_EQ(budget.largest(), 1);
  budget.give("uid:2");
  EXPECT_TRUE(budget.tryTake("uid:4"));
}

struct sockaddr_storage v4(const char* ip) {
  struct sockaddr_storage ss {};
  auto* sin = reinterpret_cast<struct sockaddr_in*>(&ss);
  sin->sin_family = AF_INET;
  ::inet_pton(AF_INET, ip, &sin->sin_addr);
  return ss;
}

struct sockaddr_storage v6(const char* ip) {
  struct sockaddr_storage ss {};
  auto* sin6 = reinterpret_cast<struct sockaddr_in6*>(&ss);
  sin6->sin6_family = AF_INET6;
  ::inet_pton(AF_INET6, ip, &sin6->sin6_addr);
  return ss;
}

TEST(ConnectionBudgetTest, RemoteAddressKeys) {
  EXPECT_EQ(addressKey(v4("10.0.0.7")), "ip:10.0.0.7");
  EXPECT_EQ(addressKey(v6("::ffff:10.0.0.7")), "ip:10.0.0.7");
  EXPECT_EQ(addressKey(v6("2001:db8:1:2:aaaa::1")), "ip6:2001:db8:1:2::/64");
  EXPECT_EQ(addressKey(v6("2001:db8:1:2:bbbb::9")), addressKey(v6("2001:db8:1:2::1")));
}

// A connection from `source` (bound before connect) to a listener on 127.0.0.1; returns the server's end.
UniqueFd acceptFrom(const char* source, UniqueFd* client_end) {
  UniqueFd listener(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  struct sockaddr_storage addr = v4("127.0.0.1");
  EXPECT_EQ(::bind(listener.get(), reinterpret_cast<struct sockaddr*>(&addr), sizeof(struct sockaddr_in)), 0);
  EXPECT_EQ(::listen(listener.get(), 4), 0);
  socklen_t len = sizeof(addr);
  ::getsockname(listener.get(), reinterpret_cast<struct sockaddr*>(&addr), &len);
  *client_end = UniqueFd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  struct sockaddr_storage src = v4(source);
  EXPECT_EQ(::bind(client_end->get(), reinterpret_cast<struct sockaddr*>(&src), sizeof(struct sockaddr_in)), 0)
      << strerror(errno);
  EXPECT_EQ(::connect(client_end->get(), reinterpret_cast<struct sockaddr*>(&addr), sizeof(struct sockaddr_in)), 0)
      << strerror(errno);
  return UniqueFd(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
}

TEST(ConnectionBudgetTest, LocalPeersAreKnownByTheirUidWhateverTheirAddress) {
  const std::string mine = "uid:" + std::to_string(::getuid());
  for (const char* source : {"127.0.0.1", "127.0.0.2", "127.0.0.77"}) {
    UniqueFd client;
    UniqueFd server_end = acceptFrom(source, &client);
    ASSERT_TRUE(server_end.valid());
    EXPECT_EQ(localPeerUid(server_end.get()), std::optional<uint32_t>(::getuid())) << source;
    EXPECT_EQ(clientKeyOf(server_end.get()), mine) << source;
  }
}

TEST(ConnectionBudgetTest, APeerThatIsGoneIsKnownByAddress) {
  UniqueFd client;
  UniqueFd server_end = acceptFrom("127.0.0.3", &client);
  ASSERT_TRUE(server_end.valid());
  ::close(client.release());  // the client's socket now lingers without an owner (FIN_WAIT/TIME_WAIT)
  std::string key = clientKeyOf(server_end.get());
  // Either still found with its owner, or (once it has no owner to report) the address: never someone else.
  EXPECT_TRUE(key == "uid:" + std::to_string(::getuid()) || key == "ip:127.0.0.3") << key;
}

}  // namespace
}  // namespace dsec::launcher
