// Base64 (RFC 4648) for the API's binary fields (stdin_b64, files, file contents): one codec for the node, the
// gateway, the CLI and the tests, on OpenSSL's block coder.
#pragma once

#include <string>
#include <string_view>

#include "dsec/common/Result.h"

namespace dsec {

// Standard alphabet, padded.
std::string base64Encode(std::string_view bytes);
// Accepts the standard and the URL-safe alphabet, with or without padding, and ignores CR/LF (wrapped
// text); anything else is kInvalidArgument naming what is wrong.
Result<std::string> base64Decode(std::string_view text);

}  // namespace dsec
