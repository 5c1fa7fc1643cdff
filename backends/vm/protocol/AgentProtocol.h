// The wire format between the node (AgentChannel) and dsec-guest-agent, over one virtio-serial port per request.
// Standard library only: the agent is a small static binary.
//
// A frame is a 12-byte header, then `length` bytes of payload:
//   u32 length | u16 type | u16 flags (0) | u32 request
// little-endian. `request` names the request a frame belongs to: the host numbers its requests on each port and the
// agent answers with the same number, so a frame of an earlier (abandoned) request is never taken for an answer.
// Payloads are sequences of fixed-width integers and length-prefixed strings (Writer/Reader); every count and length
// is checked against what is left, so a hostile peer can make a decode fail but never read past its frame.
// There is no flow control of our own: a port carries one request at a time and a writer blocks on the port.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dsec::vm::protocol {

inline constexpr size_t kHeaderBytes = 12;
inline constexpr uint32_t kMaxPayload = 1u << 20;  // larger frames are refused before their payload is read
inline constexpr size_t kMaxChunk = 64u << 10;     // bytes of output, stdin or file data per frame
inline constexpr uint32_t kMaxItems = 1u << 16;    // argv, env, directory entries per frame
inline constexpr uint32_t kMaxStringBytes = kMaxPayload;

enum class FrameType : uint16_t {
  // node -> agent
  kHello = 1,       // HelloMsg: drop whatever an earlier peer left on this port; answered by kHelloOk
  kSetup = 2,       // SetupMsg -> kOk | kError
  kRestored = 3,    // RestoredMsg -> kOk | kError
  kExec = 4,        // ExecMsg -> kStarted, kStdout/kStderr..., kExit | kError
  kStdin = 5,       // raw bytes for the running command's stdin (or its terminal)
  kStdinEof = 6,    // empty
  kResize = 7,      // ResizeMsg
  kSignal = 8,      // SignalMsg
  kCancel = 9,      // empty: kill the running command (its kExit still comes)
  kReadFile = 10,   // PathMsg -> kData..., kDataEof | kError
  kWriteFile = 11,  // PathMsg -> kOk (ready), then the node sends kData..., kDataEof -> kOk | kError
  kData = 12,       // raw bytes (either direction)
  kDataEof = 13,    // empty (either direction)
  kStat = 14,       // PathMsg -> kStatReply | kError
  kListDir = 15,    // PathMsg -> kDirEntries..., kOk | kError
  kRemove = 16,     // PathMsg -> kOk | kError
  kUsage = 17,      // empty -> kUsageReply
  kReclaim = 18,    // empty -> kOk
  // agent -> node
  kHelloOk = 64,     // HelloMsg (the same nonce)
  kOk = 65,          // empty
  kError = 66,       // ErrorMsg
  kStarted = 67,     // empty: the command exec'd
  kStdout = 68,      // raw bytes
  kStderr = 69,      // raw bytes
  kExit = 70,        // ExitMsg
  kStatReply = 71,   // StatEntry
  kDirEntries = 72,  // DirEntriesMsg
  kUsageReply = 73,  // UsageMsg
};

inline bool isKnownFrameType(uint16_t type) { return (type >= 1 && type <= 18) || (type >= 64 && type <= 73); }

struct FrameHeader {
  uint32_t length = 0;
  uint16_t type = 0;
  uint16_t flags = 0;
  uint32_t request = 0;
};

struct Frame {
  FrameType type = FrameType::kOk;
  uint32_t request = 0;
  std::string payload;
};

inline void putU16(char* p, uint16_t v) {
  p[0] = static_cast<char>(v & 0xff);
  p[1] = static_cast<char>(v >> 8);
}
inline void putU32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
inline uint16_t getU16(const char* p) {
  return static_cast<uint16_t>(static_cast<uint8_t>(p[0]) | (static_cast<uint8_t>(p[1]) << 8));
}
inline uint32_t getU32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

// The whole frame (header and payload) as bytes to write. payload.size() must be <= kMaxPayload.
inline std::string encodeFrame(FrameType type, uint32_t request, std::string_view payload) {
  std::string out(kHeaderBytes, '\0');
  putU32(out.data(), static_cast<uint32_t>(payload.size()));
  putU16(out.data() + 4, static_cast<uint16_t>(type));
  putU16(out.data() + 6, 0);
  putU32(out.data() + 8, request);
  out.append(payload);
  return out;
}

enum class HeaderError { kNone, kOversize, kBadType, kBadFlags };

inline HeaderError decodeHeader(const char* p, FrameHeader* out) {
  out->length = getU32(p);
  out->type = getU16(p + 4);
  out->flags = getU16(p + 6);
  out->request = getU32(p + 8);
  if (out->length > kMaxPayload) return HeaderError::kOversize;
  if (!isKnownFrameType(out->type)) return HeaderError::kBadType;
  if (out->flags != 0) return HeaderError::kBadFlags;
  return HeaderError::kNone;
}

inline const char* headerErrorName(HeaderError e) {
  switch (e) {
    case HeaderError::kNone:
      return "none";
    case HeaderError::kOversize:
      return "oversize frame";
    case HeaderError::kBadType:
      return "unknown frame type";
    case HeaderError::kBadFlags:
      return "nonzero frame flags";
  }
  return "?";
}

// Cuts frames out of a byte stream. Bytes are appended as they are read; next() hands out complete frames. A bad
// header is sticky: the stream cannot be resynchronised (the caller drops the connection or the request).
class FrameParser {
 public:
  enum class Status { kNeedMore, kFrame, kError };

  void append(const char* data, size_t size) {
    if (pos_ > 0 && pos_ == buf_.size()) {
      buf_.clear();
      pos_ = 0;
    }
    buf_.append(data, size);
  }
  // How many bytes a reader should ask for next (never more than the rest of the current frame plus a chunk).
  size_t wanted() const { return kMaxChunk + kHeaderBytes; }
  size_t buffered() const { return buf_.size() - pos_; }

  Status next(Frame* out) {
    if (error_ != HeaderError::kNone) return Status::kError;
    if (buffered() < kHeaderBytes) return Status::kNeedMore;
    FrameHeader h;
    error_ = decodeHeader(buf_.data() + pos_, &h);
    if (error_ != HeaderError::kNone) return Status::kError;
    if (buffered() < kHeaderBytes + h.length) return Status::kNeedMore;
    out->type = static_cast<FrameType>(h.type);
    out->request = h.request;
    out->payload.assign(buf_.data() + pos_ + kHeaderBytes, h.length);
    pos_ += kHeaderBytes + h.length;
    if (pos_ > (1u << 20) && pos_ * 2 > buf_.size()) {  // keep the buffer from growing with consumed bytes
      buf_.erase(0, pos_);
      pos_ = 0;
    }
    return Status::kFrame;
  }
  HeaderError error() const { return error_; }

 private:
  std::string buf_;
  size_t pos_ = 0;
  HeaderError error_ = HeaderError::kNone;
};

// Payload encoding.
class Writer {
 public:
  Writer& u8(uint8_t v) {
    out_.push_back(static_cast<char>(v));
    return *this;
  }
  Writer& u32(uint32_t v) {
    char b[4];
    putU32(b, v);
    out_.append(b, 4);
    return *this;
  }
  Writer& i64(int64_t v) {
    auto u = static_cast<uint64_t>(v);
    u32(static_cast<uint32_t>(u & 0xffffffffu));
    return u32(static_cast<uint32_t>(u >> 32));
  }
  Writer& str(std::string_view s) {
    u32(static_cast<uint32_t>(s.size()));
    out_.append(s);
    return *this;
  }
  Writer& strings(const std::vector<std::string>& v) {
    u32(static_cast<uint32_t>(v.size()));
    for (const auto& s : v) str(s);
    return *this;
  }
  Writer& strMap(const std::map<std::string, std::string>& m) {
    u32(static_cast<uint32_t>(m.size()));
    for (const auto& [k, v] : m) str(k).str(v);
    return *this;
  }
  const std::string& bytes() const { return out_; }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

// Payload decoding; any short read or impossible count clears ok() and every later read returns zero values.
class Reader {
 public:
  explicit Reader(std::string_view data) : p_(data.data()), left_(data.size()) {}
  bool ok() const { return ok_; }
  // ok() and nothing left over: what a complete message decodes to.
  bool done() const { return ok_ && left_ == 0; }

  uint8_t u8() {
    if (!need(1)) return 0;
    uint8_t v = static_cast<uint8_t>(*p_);
    advance(1);
    return v;
  }
  uint32_t u32() {
    if (!need(4)) return 0;
    uint32_t v = getU32(p_);
    advance(4);
    return v;
  }
  int64_t i64() {
    uint64_t lo = u32();
    uint64_t hi = u32();
    return static_cast<int64_t>(lo | (hi << 32));
  }
  std::string str() {
    uint32_t n = u32();
    if (n > kMaxStringBytes || !need(n)) return {};
    std::string s(p_, n);
    advance(n);
    return s;
  }
  std::vector<std::string> strings() {
    uint32_t n = u32();
    std::vector<std::string> v;
    if (n > kMaxItems || !need(static_cast<size_t>(n) * 4)) return v;
    v.reserve(n);
    for (uint32_t i = 0; i < n && ok_; ++i) v.push_back(str());
    return v;
  }
  std::map<std::string, std::string> strMap() {
    uint32_t n = u32();
    std::map<std::string, std::string> m;
    if (n > kMaxItems || !need(static_cast<size_t>(n) * 8)) return m;
    for (uint32_t i = 0; i < n && ok_; ++i) {
      std::string k = str();
      std::string v = str();
      m[std::move(k)] = std::move(v);
    }
    return m;
  }
  // Marks the message bad (a field out of range).
  void fail() { ok_ = false; }

 private:
  bool need(size_t n) {
    if (!ok_ || n > left_) {
      ok_ = false;
      return false;
    }
    return true;
  }
  void advance(size_t n) {
    p_ += n;
    left_ -= n;
  }
  const char* p_;
  size_t left_;
  bool ok_ = true;
};

// Messages. decode() returns false for anything malformed (short, trailing bytes, out of range).
struct HelloMsg {
  int64_t nonce = 0;
  std::string encode() const { return Writer().i64(nonce).take(); }
  bool decode(std::string_view p) {
    Reader r(p);
    nonce = r.i64();
    return r.done();
  }
};

struct SetupMsg {
  std::string hostname;
  uint32_t layer_disks = 0;
  int64_t upper_bytes = 0;
  int64_t pids = 0;
  std::map<std::string, std::string> env;
  // The image's own init ("/sbin/init"), run as PID 1 once the root is ready (the agent goes on beside it);
  // "" : the agent stays PID 1.
  std::string init;
  std::string encode() const {
    return Writer().str(hostname).u32(layer_disks).i64(upper_bytes).i64(pids).strMap(env).str(init).take();
  }
  bool decode(std::string_view p) {
    Reader r(p);
    hostname = r.str();
    layer_disks = r.u32();
    upper_bytes = r.i64();
    pids = r.i64();
    env = r.strMap();
    init = r.str();
    if (layer_disks > 26 || upper_bytes < 0 || pids < 0 || hostname.size() > 64 || init.size() > 256 ||
        (!init.empty() && init[0] != '/')) {
      r.fail();
    }
    return r.done();
  }
};

struct RestoredMsg {
  std::string hostname;
  int64_t wall_clock_ns = 0;
  std::string entropy;
  std::string encode() const { return Writer().str(hostname).i64(wall_clock_ns).str(entropy).take(); }
  bool decode(std::string_view p) {
    Reader r(p);
    hostname = r.str();
    wall_clock_ns = r.i64();
    entropy = r.str();
    if (hostname.size() > 64 || entropy.size() > 4096 || wall_clock_ns < 0) r.fail();
    return r.done();
  }
};

struct ExecMsg {
  std::vector<std::string> argv;
  std::map<std::string, std::string> env;
  std::string cwd = "/";
  std::string stdin_data;
  bool stdin_stream = false;  // kStdin frames follow until kStdinEof (stdin_data unused)
  bool tty = false;
  uint32_t rows = 24;
  uint32_t cols = 80;
  int64_t timeout_ms = 0;  // 0 = none
  int64_t output_cap = 0;  // bytes kept per stream
  std::string encode() const {
    return Writer()
        .strings(argv)
        .strMap(env)
        .str(cwd)
        .str(stdin_data)
        .u8(stdin_stream ? 1 : 0)
        .u8(tty ? 1 : 0)
        .u32(rows)
        .u32(cols)
        .i64(timeout_ms)
        .i64(output_cap)
        .take();
  }
  bool decode(std::string_view p) {
    Reader r(p);
    argv = r.strings();
    env = r.strMap();
    cwd = r.str();
    stdin_data = r.str();
    uint8_t stream = r.u8();
    uint8_t t = r.u8();
    rows = r.u32();
    cols = r.u32();
    timeout_ms = r.i64();
    output_cap = r.i64();
    if (stream > 1 || t > 1 || argv.empty() || rows == 0 || rows > 10000 || cols == 0 || cols > 10000 ||
        timeout_ms < 0 || output_cap < 0) {
      r.fail();
    }
    stdin_stream = stream == 1;
    tty = t == 1;
    return r.done();
  }
};

struct ResizeMsg {
  uint32_t rows = 0;
  uint32_t cols = 0;
  std::string encode() const { return Writer().u32(rows).u32(cols).take(); }
  bool decode(std::string_view p) {
    Reader r(p);
    rows = r.u32();
    cols = r.u32();
    if (rows == 0 || rows > 10000 || cols == 0 || cols > 10000) r.fail();
    return r.done();
  }
};

struct SignalMsg {
  uint32_t sig = 0;
  std::string encode() const { return Writer().u32(sig).take(); }
  bool decode(std::string_view p) {
    Reader r(p);
    sig = r.u32();
    if (sig == 0 || sig > 64) r.fail();
    return r.done();
  }
};

struct PathMsg {
  std::string path;
  uint32_t mode = 0;
  bool recursive = false;
  std::string encode() const { return Writer().str(path).u32(mode).u8(recursive ? 1 : 0).take(); }
  bool decode(std::string_view p) {
    Reader r(p);
    path = r.str();
    mode = r.u32();
    uint8_t rec = r.u8();
    if (path.empty() || path.size() > 4096 || path.find('\0') != std::string::npos || mode > 07777 || rec > 1) {
      r.fail();
    }
    recursive = rec == 1;
    return r.done();
  }
};

inline constexpr size_t kMaxErrorMessage = 1024;

struct ErrorMsg {
  int32_t err = 0;  // errno in the guest
  std::string message;
  std::string encode() const {
    return Writer().u32(static_cast<uint32_t>(err)).str(message.substr(0, kMaxErrorMessage)).take();
  }
  bool decode(std::string_view p) {
    Reader r(p);
    err = static_cast<int32_t>(r.u32());
    message = r.str();
    if (err < 0 || err > 4095 || message.size() > kMaxErrorMessage) r.fail();
    return r.done();
  }
};

struct ExitMsg {
  int32_t exit_code = -1;
  int32_t signal = 0;
  bool timed_out = false;
  bool truncated = false;
  int64_t duration_us = 0;
  std::string encode() const {
    return Writer()
        .u32(static_cast<uint32_t>(exit_code))
        .u32(static_cast<uint32_t>(signal))
        .u8(timed_out ? 1 : 0)
        .u8(truncated ? 1 : 0)
        .i64(duration_us)
        .take();
  }
  bool decode(std::string_view p) {
    Reader r(p);
    exit_code = static_cast<int32_t>(r.u32());
    signal = static_cast<int32_t>(r.u32());
    uint8_t t = r.u8();
    uint8_t tr = r.u8();
    duration_us = r.i64();
    if (exit_code < 0 || exit_code > 255 || signal < 0 || signal > 64 || t > 1 || tr > 1 || duration_us < 0) r.fail();
    timed_out = t == 1;
    truncated = tr == 1;
    return r.done();
  }
};

enum class EntryType : uint8_t { kFile = 0, kDir = 1, kSymlink = 2, kOther = 3 };

struct StatEntry {
  std::string name;
  EntryType type = EntryType::kOther;
  int64_t size = 0;
  uint32_t mode = 0;
  int64_t mtime = 0;
  void encodeInto(Writer& w) const { w.str(name).u8(static_cast<uint8_t>(type)).i64(size).u32(mode).i64(mtime); }
  void decodeFrom(Reader& r) {
    name = r.str();
    uint8_t t = r.u8();
    size = r.i64();
    mode = r.u32();
    mtime = r.i64();
    if (t > 3 || size < 0 || mode > 07777 || name.size() > 4096) r.fail();
    type = static_cast<EntryType>(t);
  }
  std::string encode() const {
    Writer w;
    encodeInto(w);
    return w.take();
  }
  bool decode(std::string_view p) {
    Reader r(p);
    decodeFrom(r);
    return r.done();
  }
};

struct DirEntriesMsg {
  std::vector<StatEntry> entries;
  std::string encode() const {
    Writer w;
    w.u32(static_cast<uint32_t>(entries.size()));
    for (const auto& e : entries) e.encodeInto(w);
    return w.take();
  }
  bool decode(std::string_view p) {
    Reader r(p);
    uint32_t n = r.u32();
    entries.clear();
    if (n > kMaxItems || n * static_cast<size_t>(25) > p.size()) r.fail();
    for (uint32_t i = 0; i < n && r.ok(); ++i) entries.emplace_back().decodeFrom(r);
    return r.done();
  }
};

struct UsageMsg {
  int64_t memory_used = 0;
  int64_t pids = 0;
  std::string encode() const { return Writer().i64(memory_used).i64(pids).take(); }
  bool decode(std::string_view p) {
    Reader r(p);
    memory_used = r.i64();
    pids = r.i64();
    if (memory_used < 0 || pids < 0) r.fail();
    return r.done();
  }
};

}  // namespace dsec::vm::protocol
