#include "DnsMessage.h"

#include <algorithm>
#include <set>

namespace dsec::backends::dns {
namespace {

constexpr int kMaxPointerHops = 64;
constexpr size_t kMaxRecords = 512;  // more than any answer of kMaxMessage bytes can hold

uint16_t u16(Bytes m, size_t at) { return static_cast<uint16_t>(m[at] << 8 | m[at + 1]); }
uint32_t u32(Bytes m, size_t at) {
  return static_cast<uint32_t>(m[at]) << 24 | static_cast<uint32_t>(m[at + 1]) << 16 |
         static_cast<uint32_t>(m[at + 2]) << 8 | m[at + 3];
}

Error malformed(const std::string& why) { return Error::invalid("malformed DNS message: " + why); }

void appendLabel(std::string& out, Bytes m, size_t at, size_t len) {
  char text[64 * 4 + 1];  // a label is at most 63 bytes, each at most "\DDD"
  size_t n = 0;
  if (!out.empty()) text[n++] = '.';
  for (size_t i = 0; i < len; ++i) {
    const unsigned char c = m[at + i];
    if (c >= 'A' && c <= 'Z') {
      text[n++] = static_cast<char>(c - 'A' + 'a');
    } else if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_') {
      text[n++] = static_cast<char>(c);
    } else {
      text[n++] = '\\';
      text[n++] = static_cast<char>('0' + c / 100);
      text[n++] = static_cast<char>('0' + c / 10 % 10);
      text[n++] = static_cast<char>('0' + c % 10);
    }
  }
  out.append(text, n);
}

struct Header {
  uint16_t id, flags, qd, an, ns, ar;
};

Result<Header> readHeader(Bytes m) {
  if (m.size() < kHeaderSize) return malformed("shorter than a header");
  return Header{u16(m, 0), u16(m, 2), u16(m, 4), u16(m, 6), u16(m, 8), u16(m, 10)};
}

Result<Question> readQuestion(Bytes m, size_t offset) {
  Question q;
  DSEC_ASSIGN_OR_RETURN(q.name, readName(m, &offset));
  if (m.size() - offset < 4) return malformed("question cut short");
  q.type = u16(m, offset);
  q.klass = u16(m, offset + 2);
  q.end = offset + 4;
  return q;
}

struct Record {
  std::string name;
  uint16_t type = 0, klass = 0;
  uint32_t ttl = 0;
  size_t rdata = 0, rdlength = 0;
};

Result<Record> readRecord(Bytes m, size_t* offset) {
  Record r;
  DSEC_ASSIGN_OR_RETURN(r.name, readName(m, offset));
  if (m.size() - *offset < 10) return malformed("record cut short");
  r.type = u16(m, *offset);
  r.klass = u16(m, *offset + 2);
  r.ttl = u32(m, *offset + 4);
  r.rdlength = u16(m, *offset + 8);
  r.rdata = *offset + 10;
  if (m.size() - r.rdata < r.rdlength) return malformed("record data cut short");
  *offset = r.rdata + r.rdlength;
  return r;
}

}  // namespace

uint16_t messageId(Bytes message) { return message.size() < kHeaderSize ? 0 : u16(message, 0); }

Result<std::string> readName(Bytes m, size_t* offset) {
  std::string out;
  size_t pos = *offset;
  size_t lowest = pos;  // every pointer must go below every byte of the name read so far: the walk ends
  size_t wire = 0;
  bool jumped = false;
  for (int hops = 0;;) {
    if (pos >= m.size()) return malformed("name runs past the end");
    const uint8_t len = m[pos];
    if ((len & 0xC0) == 0xC0) {
      if (pos + 1 >= m.size()) return malformed("pointer cut short");
      const size_t target = static_cast<size_t>(len & 0x3F) << 8 | m[pos + 1];
      if (target >= lowest) return malformed("compression pointer does not point backwards");
      if (++hops > kMaxPointerHops) return malformed("too many compression pointers");
      if (!jumped) *offset = pos + 2;
      jumped = true;
      pos = lowest = target;
      continue;
    }
    if ((len & 0xC0) != 0) return malformed("unknown label type");
    wire += 1 + len;
    if (wire > kMaxNameBytes) return malformed("name longer than 255 bytes");
    if (len == 0) break;
    if (m.size() - pos - 1 < len) return malformed("label runs past the end");
    appendLabel(out, m, pos + 1, len);
    pos += 1 + len;
  }
  if (!jumped) *offset = pos + 1;
  if (out.empty()) return std::string(1, '.');  // the root
  return out;
}

Result<Question> parseQuery(Bytes m) {
  DSEC_ASSIGN_OR_RETURN(Header h, readHeader(m));
  if ((h.flags & 0x8000) != 0) return malformed("not a query (QR set)");
  if (((h.flags >> 11) & 0xF) != 0) return malformed("opcode is not QUERY");
  if (h.qd != 1 || h.an != 0 || h.ns != 0 || h.ar > 1) return malformed("a query asks exactly one question");
  return readQuestion(m, kHeaderSize);
}

Result<uint8_t> checkAnswer(Bytes m, uint16_t sent_id, const Question& sent) {
  DSEC_ASSIGN_OR_RETURN(Header h, readHeader(m));
  if (h.id != sent_id) return malformed("answer to another query (ID)");
  if ((h.flags & 0x8000) == 0) return malformed("not an answer (QR clear)");
  if (h.qd != 1) return malformed("an answer repeats the one question");
  DSEC_ASSIGN_OR_RETURN(Question q, readQuestion(m, kHeaderSize));
  if (q.name != sent.name || q.type != sent.type || q.klass != sent.klass) {
    return malformed("answer to another question");
  }
  return static_cast<uint8_t>(h.flags & 0xF);
}

Result<std::vector<AddressRecord>> answerAddresses(Bytes m, const std::string& name) {
  DSEC_ASSIGN_OR_RETURN(Header h, readHeader(m));
  if (h.an > kMaxRecords || h.qd > 1) return malformed("too many records");
  size_t offset = kHeaderSize;
  for (uint16_t i = 0; i < h.qd; ++i) {
    DSEC_ASSIGN_OR_RETURN(Question q, readQuestion(m, offset));
    offset = q.end;
  }
  std::vector<Record> records;
  for (uint16_t i = 0; i < h.an; ++i) {
    DSEC_ASSIGN_OR_RETURN(Record r, readRecord(m, &offset));
    if (r.klass == kClassIn) records.push_back(std::move(r));
  }
  // The chain: names reached from `name` through CNAMEs, in any order the records come (each pass adds at least
  // one name or ends, so at most one pass per record).
  std::set<std::string> chain{name};
  for (bool grew = true; grew;) {
    grew = false;
    for (const auto& r : records) {
      if (r.type != kTypeCname || !chain.count(r.name)) continue;
      size_t at = r.rdata;
      DSEC_ASSIGN_OR_RETURN(std::string target, readName(m, &at));
      if (at > r.rdata + r.rdlength) return malformed("CNAME target runs past its record");
      grew = chain.insert(target).second || grew;
    }
  }
  std::vector<AddressRecord> out;
  for (const auto& r : records) {
    if (r.type != kTypeA || r.rdlength != 4 || !chain.count(r.name)) continue;
    out.push_back({u32(m, r.rdata), r.ttl});
  }
  return out;
}

void appendU16(std::vector<uint8_t>& out, uint16_t value) {
  out.push_back(static_cast<uint8_t>(value >> 8));
  out.push_back(static_cast<uint8_t>(value));
}

void appendU32(std::vector<uint8_t>& out, uint32_t value) {
  appendU16(out, static_cast<uint16_t>(value >> 16));
  appendU16(out, static_cast<uint16_t>(value));
}

void appendName(std::vector<uint8_t>& out, const std::string& name) {
  size_t start = 0;
  while (start < name.size() && name != ".") {
    size_t dot = name.find('.', start);
    if (dot == std::string::npos) dot = name.size();
    const size_t len = std::min<size_t>(dot - start, 63);
    out.push_back(static_cast<uint8_t>(len));
    out.insert(out.end(), name.begin() + static_cast<std::ptrdiff_t>(start),
               name.begin() + static_cast<std::ptrdiff_t>(start + len));
    start = dot + 1;
  }
  out.push_back(0);
}

std::vector<uint8_t> headerReply(Bytes query, uint8_t rcode) {
  std::vector<uint8_t> out;
  appendU16(out, messageId(query));
  const uint16_t rd = query.size() >= kHeaderSize ? (u16(query, 2) & 0x0100) : 0;
  appendU16(out, static_cast<uint16_t>(0x8000 | rd | 0x0080 | (rcode & 0xF)));  // QR, RD as asked, RA
  for (int i = 0; i < 4; ++i) appendU16(out, 0);
  return out;
}

std::vector<uint8_t> replyTo(Bytes query, const Question& question, uint8_t rcode) {
  std::vector<uint8_t> out = headerReply(query, rcode);
  out[5] = 1;  // QDCOUNT
  out.insert(out.end(), query.begin() + kHeaderSize, query.begin() + static_cast<std::ptrdiff_t>(question.end));
  return out;
}

void setId(std::vector<uint8_t>& message, uint16_t id) {
  if (message.size() < 2) return;
  message[0] = static_cast<uint8_t>(id >> 8);
  message[1] = static_cast<uint8_t>(id);
}

std::vector<uint8_t> buildQuery(uint16_t id, const std::string& name, uint16_t type) {
  std::vector<uint8_t> out;
  appendU16(out, id);
  appendU16(out, 0x0100);  // RD
  appendU16(out, 1);
  for (int i = 0; i < 3; ++i) appendU16(out, 0);
  appendName(out, name);
  appendU16(out, type);
  appendU16(out, kClassIn);
  return out;
}

void appendRecord(std::vector<uint8_t>& out, const std::string& name, uint16_t type, uint32_t ttl,
                  const std::vector<uint8_t>& rdata) {
  appendName(out, name);
  appendU16(out, type);
  appendU16(out, kClassIn);
  appendU32(out, ttl);
  appendU16(out, static_cast<uint16_t>(rdata.size()));
  out.insert(out.end(), rdata.begin(), rdata.end());
}

}  // namespace dsec::backends::dns
