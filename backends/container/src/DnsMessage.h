// DNS messages (RFC 1035) as the node's resolver (NodeResolver.h) reads and writes them: the question of a
// sandbox's query, the addresses an upstream answer gives for it, and the short replies the resolver makes itself.
// Everything read here comes from a hostile sandbox or the network: every length and offset is checked against the
// message, compression pointers must point before every place the name was read from (so a name ends), and a
// name is at most 255 bytes. No recursion.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dsec/common/Result.h"

namespace dsec::backends::dns {

constexpr size_t kHeaderSize = 12;
constexpr size_t kMaxNameBytes = 255;  // wire form, length bytes included
constexpr size_t kMaxMessage = 4096;   // what the resolver reads or relays (EDNS sizes above it are cut to it)
constexpr uint16_t kTypeA = 1;
constexpr uint16_t kTypeCname = 5;
constexpr uint16_t kTypeAaaa = 28;
constexpr uint16_t kClassIn = 1;

enum Rcode : uint8_t { kNoError = 0, kFormErr = 1, kServFail = 2, kNxDomain = 3, kNotImp = 4, kRefused = 5 };

using Bytes = std::span<const uint8_t>;

struct Question {
  std::string name;  // lower case, dot-separated, no trailing dot ("." for the root); bytes other than
                     // [a-z0-9_-] written \DDD (so a label holding a dot never reads as two labels)
  uint16_t type = 0;
  uint16_t klass = 0;
  size_t end = 0;  // offset just past the question in the message
};

uint16_t messageId(Bytes message);  // 0 if shorter than a header

// Reads the name at *offset; on success *offset is just past it (past the first pointer, if any).
Result<std::string> readName(Bytes message, size_t* offset);

// A sandbox's query: a header with QR=0, opcode QUERY, one question, no answer or authority records, at most one
// additional record (EDNS). kInvalidArgument otherwise.
Result<Question> parseQuery(Bytes message);

// An upstream's answer to `sent` (ID and question must be those of the query sent): its rcode; kInvalidArgument
// when it is not an answer to it.
Result<uint8_t> checkAnswer(Bytes answer, uint16_t sent_id, const Question& sent);

struct AddressRecord {
  uint32_t ip4 = 0;  // host order
  uint32_t ttl = 0;  // seconds
};
// The A records an answer gives for `name`: its own and those of the CNAME chain from it, as far as the answer
// section holds it. kInvalidArgument if the answer is malformed.
Result<std::vector<AddressRecord>> answerAddresses(Bytes answer, const std::string& name);

// A reply the resolver makes itself to a query it parsed: its ID, RD and question, the rcode, no records.
std::vector<uint8_t> replyTo(Bytes query, const Question& question, uint8_t rcode);
// The same without the question (a query too malformed to have one): header only.
std::vector<uint8_t> headerReply(Bytes query, uint8_t rcode);
// Replaces the ID of a message (relaying an upstream answer under the client's ID).
void setId(std::vector<uint8_t>& message, uint16_t id);

// Writing messages (the resolver's replies, and tests' servers and clients).
void appendName(std::vector<uint8_t>& out, const std::string& name);  // plain labels, no compression
void appendU16(std::vector<uint8_t>& out, uint16_t value);
void appendU32(std::vector<uint8_t>& out, uint32_t value);
std::vector<uint8_t> buildQuery(uint16_t id, const std::string& name, uint16_t type);
// One resource record (class IN).
void appendRecord(std::vector<uint8_t>& out, const std::string& name, uint16_t type, uint32_t ttl,
                  const std::vector<uint8_t>& rdata);

}  // namespace dsec::backends::dns
