// Runs a command through POST /v1/sandboxes/{id}/exec/stream and copies its output to our stdout/stderr as it
// arrives; shared by `dsec exec` and `dsec run -- CMD`.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "ApiClient.h"
#include "dsec/common/Result.h"

namespace dsec::cli {

// body is the exec request of docs/api.md. Returns the final result object ("exit_code", "timed_out", ...). With
// forward_stdin, our stdin is the command's: it is written to the exec as it is read (stdin_stream), on a
// connection of its own, and its EOF is the command's; a command that exits first just stops the copy.
Result<nlohmann::json> streamExec(ApiClient& client, const std::string& id, const nlohmann::json& body,
                                  bool forward_stdin = false);

// The exit status `dsec` should end with for an exec result (the command's own code; 137 after a timeout), and
// a note on stderr when the command timed out or was OOM-killed.
int exitCodeOf(const nlohmann::json& result, const std::string& command_name);

// Writes a command's output to our stdout or stderr. Either may be gone (a closed pipe): nothing sensible is
// left to do with the output then, so that is not an error.
void printAll(int fd, const std::string& data);

}  // namespace dsec::cli
