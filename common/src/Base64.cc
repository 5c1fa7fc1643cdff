// Base64 on OpenSSL's EVP block coder (Base64.h). The block decoder is lenient (it skips blanks, and decodes
// padding as zero bytes), so the text is checked and normalised here first and the padding's bytes dropped.
#include "dsec/common/Base64.h"

#include <openssl/evp.h>

#include <limits>

namespace dsec {

std::string base64Encode(std::string_view bytes) {
  std::string out;
  if (bytes.empty()) return out;
  out.resize(4 * ((bytes.size() + 2) / 3) + 1);  // the coder writes a terminating NUL
  // Blocks of at most INT_MAX / 2 input bytes: the coder's lengths are ints.
  constexpr size_t kBlock = static_cast<size_t>(std::numeric_limits<int>::max() / 2 / 3) * 3;
  size_t written = 0;
  for (size_t at = 0; at < bytes.size(); at += kBlock) {
    const size_t n = std::min(kBlock, bytes.size() - at);
    written += static_cast<size_t>(EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data() + written),
                                                   reinterpret_cast<const unsigned char*>(bytes.data() + at),
                                                   static_cast<int>(n)));
  }
  out.resize(written);
  return out;
}

Result<std::string> base64Decode(std::string_view text) {
  // Standard alphabet, no line breaks, padded to a multiple of 4: what the block decoder takes exactly.
  std::string clean;
  clean.reserve(text.size() + 3);
  size_t padding = 0;
  for (char c : text) {
    if (c == '\n' || c == '\r') continue;
    if (c == '=') {
      ++padding;
      continue;
    }
    if (padding != 0) return Error::invalid("invalid base64: data after '=' padding");
    if (c == '-') c = '+';
    if (c == '_') c = '/';
    const bool valid =
        (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '+' || c == '/';
    if (!valid) return Error::invalid("invalid base64 character");
    clean.push_back(c);
  }
  const size_t tail = clean.size() % 4;
  if (tail == 1 || padding > 2 || (padding != 0 && (tail == 0 || tail + padding != 4))) {
    return Error::invalid("invalid base64 length");
  }
  const size_t dropped = tail == 0 ? 0 : 4 - tail;  // zero bytes the padding decodes to
  clean.append(dropped, '=');
  if (clean.empty()) return std::string();
  if (clean.size() > static_cast<size_t>(std::numeric_limits<int>::max())) {
    return Error::invalid("base64 text too long");
  }
  std::string out(clean.size() / 4 * 3, '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(clean.data()), static_cast<int>(clean.size()));
  if (n < 0) return Error::invalid("invalid base64");
  out.resize(static_cast<size_t>(n) - dropped);
  return out;
}

}  // namespace dsec
