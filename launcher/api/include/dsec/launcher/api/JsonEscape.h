// Streaming JSON string escaping for exec output: bytes go in piece by piece, the escaped text of a JSON
// string (without the quotes) comes out, so a response is serialised in small pieces instead of as a second
// full copy (a NUL-heavy output escapes to six times its size). Same text as nlohmann::json's dump with
// ensure_ascii off and error_handler_t::replace: valid UTF-8 passes through, control characters become
// \b \f \n \r \t or \u00XX, each maximal invalid UTF-8 subsequence becomes one U+FFFD. A sequence split
// between two pieces is carried over to the next.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dsec::launcher {

class JsonStringEscaper {
 public:
  // Appends the escaped form of `data` to `out`; an incomplete UTF-8 sequence at the end is held back.
  void append(std::string_view data, std::string* out);
  // Ends the string: a held-back incomplete sequence becomes U+FFFD. The escaper can then start a new string.
  void finish(std::string* out);
  // The escaped size of `data` (as append + finish would produce on a fresh escaper), without building it.
  static uint64_t escapedSize(std::string_view data);

  // The same, counting only: for sizing a response before it is written.
  void count(std::string_view data, uint64_t* size);
  void finishCount(uint64_t* size);

  // Bytes of a sequence held back from the last piece (0..3).
  size_t pending() const { return pending_size_; }

 private:
  template <class Out>
  void run(std::string_view data, Out& out);
  template <class Out>
  void end(Out& out);

  unsigned char pending_[4] = {};
  size_t pending_size_ = 0;  // bytes of the current multi-byte sequence seen so far
  size_t pending_need_ = 0;  // its total length (2..4)
};

}  // namespace dsec::launcher
