#include "StreamExec.h"

#include <unistd.h>

#include <iostream>

#include "dsec/common/FdIo.h"

namespace dsec::cli {

void printAll(int fd, const std::string& data) { (void)writeAll(fd, data, "output"); }

Result<nlohmann::json> streamExec(ApiClient& client, const std::string& id, const nlohmann::json& body) {
  return client.stream("/v1/sandboxes/" + urlEncode(id) + "/exec/stream", body, [](const nlohmann::json& line) {
    if (!line.is_object()) return;
    if (line.contains("stdout") && line["stdout"].is_string() && !line.contains("done")) {
      printAll(STDOUT_FILENO, line["stdout"].get<std::string>());
    }
    if (line.contains("stderr") && line["stderr"].is_string() && !line.contains("done")) {
      printAll(STDERR_FILENO, line["stderr"].get<std::string>());
    }
  });
}

int exitCodeOf(const nlohmann::json& result, const std::string& command_name) {
  int code = result.value("exit_code", 1);
  if (result.value("timed_out", false)) {
    std::cerr << "dsec " << command_name << ": the command timed out and was killed\n";
  } else if (result.value("oom_killed", false)) {
    std::cerr << "dsec " << command_name << ": the command was killed: the sandbox ran out of memory\n";
  }
  if (code < 0 || code > 255) code = 1;
  return code;
}

}  // namespace dsec::cli
