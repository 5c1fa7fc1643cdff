// Streaming JSON string escaping (JsonEscape.h). The UTF-8 check accepts exactly what RFC 3629 allows: no
// overlong forms, no surrogates, nothing above U+10FFFF.
#include "dsec/launcher/api/JsonEscape.h"

namespace dsec::launcher {
namespace {

constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD in UTF-8
constexpr char kHex[] = "0123456789abcdef";

struct StringOut {
  std::string* s;
  void put(const char* data, size_t size) { s->append(data, size); }
  void put(char c) { s->push_back(c); }
};

struct CountOut {
  uint64_t* n;
  void put(const char*, size_t size) { *n += size; }
  void put(char) { *n += 1; }
};

// Plain bytes copied as they are: printable ASCII other than the quote and the backslash.
bool plain(unsigned char c) { return c >= 0x20 && c < 0x80 && c != '"' && c != '\\'; }

template <class Out>
void escapeAscii(unsigned char c, Out& out) {
  switch (c) {
    case '"':
      out.put("\\\"", 2);
      return;
    case '\\':
      out.put("\\\\", 2);
      return;
    case '\b':
      out.put("\\b", 2);
      return;
    case '\f':
      out.put("\\f", 2);
      return;
    case '\n':
      out.put("\\n", 2);
      return;
    case '\r':
      out.put("\\r", 2);
      return;
    case '\t':
      out.put("\\t", 2);
      return;
    default:
      break;
  }
  if (c < 0x20) {
    const char esc[6] = {'\\', 'u', '0', '0', kHex[c >> 4], kHex[c & 0xF]};
    out.put(esc, sizeof(esc));
  } else {
    out.put(static_cast<char>(c));
  }
}

// Length of the sequence a lead byte starts (2..4), or 0 if it cannot start one.
size_t sequenceLength(unsigned char lead) {
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

// Whether `c` may follow the bytes seen so far of a sequence that started with `lead` (`index` >= 1).
bool validContinuation(unsigned char lead, size_t index, unsigned char c) {
  if (index == 1) {
    switch (lead) {
      case 0xE0:
        return c >= 0xA0 && c <= 0xBF;  // no overlong 3-byte forms
      case 0xED:
        return c >= 0x80 && c <= 0x9F;  // no surrogates
      case 0xF0:
        return c >= 0x90 && c <= 0xBF;  // no overlong 4-byte forms
      case 0xF4:
        return c >= 0x80 && c <= 0x8F;  // nothing above U+10FFFF
      default:
        break;
    }
  }
  return c >= 0x80 && c <= 0xBF;
}

}  // namespace

template <class Out>
void JsonStringEscaper::run(std::string_view data, Out& out) {
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  const auto* end = p + data.size();
  while (p < end) {
    if (pending_size_ > 0) {
      unsigned char c = *p;
      if (!validContinuation(pending_[0], pending_size_, c)) {
        // One replacement for the broken sequence; the byte that broke it is read again on its own.
        out.put(kReplacement, 3);
        pending_size_ = 0;
        continue;
      }
      pending_[pending_size_++] = c;
      ++p;
      if (pending_size_ == pending_need_) {
        out.put(reinterpret_cast<const char*>(pending_), pending_size_);
        pending_size_ = 0;
      }
      continue;
    }
    const auto* run_start = p;
    while (p < end && plain(*p)) ++p;
    if (p > run_start) out.put(reinterpret_cast<const char*>(run_start), static_cast<size_t>(p - run_start));
    if (p == end) break;
    unsigned char c = *p++;
    if (c < 0x80) {
      escapeAscii(c, out);
      continue;
    }
    size_t need = sequenceLength(c);
    if (need == 0) {
      out.put(kReplacement, 3);  // a stray continuation byte or a byte that never starts a sequence
      continue;
    }
    pending_[0] = c;
    pending_size_ = 1;
    pending_need_ = need;
  }
}

template <class Out>
void JsonStringEscaper::end(Out& out) {
  if (pending_size_ > 0) out.put(kReplacement, 3);
  pending_size_ = 0;
}

void JsonStringEscaper::append(std::string_view data, std::string* out) {
  StringOut o{out};
  run(data, o);
}

void JsonStringEscaper::finish(std::string* out) {
  StringOut o{out};
  end(o);
}

void JsonStringEscaper::count(std::string_view data, uint64_t* size) {
  CountOut o{size};
  run(data, o);
}

void JsonStringEscaper::finishCount(uint64_t* size) {
  CountOut o{size};
  end(o);
}

uint64_t JsonStringEscaper::escapedSize(std::string_view data) {
  JsonStringEscaper e;
  uint64_t n = 0;
  e.count(data, &n);
  e.finishCount(&n);
  return n;
}

}  // namespace dsec::launcher
