// Attack: leave terminal sessions running on the node without holding a connection. A client opens
// GET /v1/sandboxes/{id}/terminal with a command that never prints and never reads (`sleep`), takes the 101 and
// closes its socket at once, before the command has started. Each such session would keep its command, a pty of
// the sandbox, the node's connection slot and two threads until the command ends, while the client holds
// nothing: a few hundred such opens take every connection the node has. What holds: a client that is gone
// before its command starts gets no command either (the earlier code hung up only a command already started).
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ApiFixture.h"
#include "dsec/common/Strings.h"
#include "dsec/launcher/api/HttpClient.h"

namespace dsec::testing {
namespace {

// Sends the handshake, reads the answer's head, and closes the socket.
std::string openAndLeave(const std::string& endpoint, const std::string& token, const std::string& id) {
  auto fd = launcher::client::connectTo(endpoint, launcher::client::CallOptions{});
  if (!fd.ok()) return "connect: " + fd.error().message();
  std::string head = "GET /v1/sandboxes/" + id +
                     "/terminal?cmd=sleep&cmd=86400 HTTP/1.1\r\nHost: node\r\nAuthorization: Bearer " + token +
                     "\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
                     "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n";
  if (::send(fd->get(), head.data(), head.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(head.size())) return "send";
  std::string answer;
  char buf[4096];
  while (answer.find("\r\n\r\n") == std::string::npos) {
    ssize_t n = ::recv(fd->get(), buf, sizeof buf, 0);
    if (n < 0 && errno == EAGAIN) continue;
    if (n <= 0) break;
    answer.append(buf, static_cast<size_t>(n));
  }
  return answer.substr(0, answer.find("\r\n"));  // the socket closes here
}

TEST_F(ApiTest, ATerminalWhoseClientLeftBeforeTheStartLeavesNoCommand) {
  startNode();
  SKIP_WITHOUT_BACKEND();
  std::string id = createSandbox();
  ASSERT_FALSE(id.empty());
  for (int i = 0; i < 4; ++i) {
    std::string status = openAndLeave(node_->endpoint(), node_->token(), id);
    ASSERT_NE(status.find(" 101 "), std::string::npos) << status;
  }
  // Each left session's command is killed once the node sees its client gone; wait for that (no sleep left).
  std::string ps;
  for (int round = 0; round < 300; ++round) {
    HttpReply r = exec(id, {{"cmd", {"ps", "-o", "args"}}});
    ASSERT_EQ(r.status, 200) << r.body;
    ps = r.json()["stdout"].get<std::string>();
    if (ps.find("sleep 86400") == std::string::npos) break;
    usleep(100 * 1000);
  }
  EXPECT_EQ(ps.find("sleep 86400"), std::string::npos) << "terminal commands outlived their clients:\n" << ps;
}

}  // namespace
}  // namespace dsec::testing
