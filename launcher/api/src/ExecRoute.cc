// POST /v1/sandboxes/{id}/exec, buffered or streamed as NDJSON, and the streamed stdin of a running exec
// (ApiServer.h, StdinFeeds.h).
#include <mutex>

#include "dsec/common/Logging.h"
#include "dsec/launcher/api/ApiServer.h"
#include "dsec/launcher/api/ExecResponse.h"
#include "dsec/launcher/api/JsonEscape.h"
#include "dsec/launcher/api/Requests.h"
#include "dsec/launcher/api/StdinFeeds.h"

namespace dsec::launcher {
namespace {

using nlohmann::json;
constexpr size_t kEscapeSlice = size_t{16} * 1024;  // output bytes escaped at a time (at most 96 KiB out)

// Streams exec output as NDJSON lines; the backend may call it from its reader threads. Each piece of output
// is escaped and written a slice at a time, so a connection never holds more than one escaped slice; a UTF-8
// sequence split between pieces is carried to the next line by the stream's escaper.
class NdjsonSink : public backends::ExecSink {
 public:
  // exec_id: the id its stdin is written to (streamed stdin), else empty; stdin_read_end: the node's copy of the
  // command's stdin, let go once the command holds its own (so its exit breaks the pipe for writers).
  NdjsonSink(HttpExchange& ex, std::string exec_id, UniqueFd stdin_read_end, HangUpWatch* hangups,
             std::shared_ptr<StdinFeed> feed)
      : ex_(ex),
        exec_id_(std::move(exec_id)),
        stdin_read_end_(std::move(stdin_read_end)),
        hangups_(hangups),
        feed_(std::move(feed)) {}
  ~NdjsonSink() override {
    if (hangup_token_ != 0) hangups_->unwatch(hangup_token_);  // before the connection can be closed
  }
  NdjsonSink(const NdjsonSink&) = delete;
  NdjsonSink& operator=(const NdjsonSink&) = delete;

  // The stream opens as the command starts, whether or not it ever writes: the first line says it runs.
  bool onStarted(const std::shared_ptr<backends::ExecControl>& control) override {
    std::lock_guard lock(mu_);
    stdin_read_end_.reset();
    if (feed_) feed_->setControl(control);  // POST .../exec/{id}/signal reaches it from now
    // A silent command learns of its client's going from the connection itself, not from a failed write.
    if (auto token = hangups_->watch(ex_.socketFd(), control); token.ok()) {
      hangup_token_ = *token;
    } else {
      DSEC_LOG(kWarn, "api") << token.error().toString() << ": a silent stream outlives its client";
    }
    if (!open()) return false;
    json line = {{"started", true}};
    if (!exec_id_.empty()) line["exec_id"] = exec_id_;
    std::string text = line.dump() + "\n";
    return ex_.writeStream(text.data(), text.size());
  }
  bool onStdout(const char* data, size_t size) override { return emit("{\"stdout\":\"", &out_escaper_, data, size); }
  bool onStderr(const char* data, size_t size) override { return emit("{\"stderr\":\"", &err_escaper_, data, size); }

  // Flushes held-back partial UTF-8 (as U+FFFD) and opens the stream if no output came.
  bool finish() {
    std::lock_guard lock(mu_);
    for (auto [prefix, escaper] :
         {std::pair{"{\"stdout\":\"", &out_escaper_}, std::pair{"{\"stderr\":\"", &err_escaper_}}) {
      if (escaper->pending() == 0) continue;
      if (!open()) return false;
      std::string line = prefix;
      escaper->finish(&line);
      line += "\"}\n";
      if (!ex_.writeStream(line.data(), line.size())) return false;
    }
    return open();
  }
  bool started() const { return started_; }
  bool writeLast(const json& j) {
    std::lock_guard lock(mu_);
    std::string line = j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
    return ex_.writeStream(line.data(), line.size());
  }

 private:
  bool open() {
    if (!started_) {
      started_ = true;
      return ex_.beginStream(200, "application/x-ndjson", std::nullopt, {{"Cache-Control", "no-store"}});
    }
    return !ex_.broken();
  }
  bool emit(const char* prefix, JsonStringEscaper* escaper, const char* data, size_t size) {
    std::lock_guard lock(mu_);
    bool line_open = false;
    for (size_t off = 0; off < size; off += kEscapeSlice) {
      buf_.clear();
      if (!line_open) buf_ = prefix;
      size_t before = buf_.size();
      escaper->append(std::string_view(data + off, std::min(kEscapeSlice, size - off)), &buf_);
      if (buf_.size() == before) continue;  // only part of a UTF-8 sequence so far
      if (!line_open && !open()) return false;
      line_open = true;
      if (!ex_.writeStream(buf_.data(), buf_.size())) return false;
    }
    if (!line_open) return !ex_.broken();
    return ex_.writeStream("\"}\n", 3);
  }

  HttpExchange& ex_;
  const std::string exec_id_;
  UniqueFd stdin_read_end_;
  HangUpWatch* hangups_;
  std::shared_ptr<StdinFeed> feed_;  // the exec's feed when its stdin is streamed (signals reach it through it)
  uint64_t hangup_token_ = 0;        // watched from the start (0: not)
  std::mutex mu_;
  bool started_ = false;
  JsonStringEscaper out_escaper_, err_escaper_;
  std::string buf_;
};

}  // namespace

size_t completeUtf8Prefix(std::string_view data) {
  size_t n = data.size();
  for (size_t back = 1; back <= 4 && back <= n; ++back) {
    unsigned char c = static_cast<unsigned char>(data[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    size_t need = (c & 0x80) == 0 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
    return need > back ? n - back : n;
  }
  return n;
}

json execResultToJson(const backends::ExecResult& r) {
  return json{{"exit_code", r.exit_code},   {"signal", r.signal},
              {"stdout", r.stdout_data},    {"stderr", r.stderr_data},
              {"timed_out", r.timed_out},   {"truncated", r.truncated},
              {"oom_killed", r.oom_killed}, {"duration", r.duration_seconds}};
}

void ApiServer::exec(HttpExchange& ex, const std::string& id, bool stream) {
  auto body = readJsonBody(ex, kExecBodyLimit);
  if (!body) return;
  // "stdin_stream": the command's stdin is written while it runs (POST .../exec/{exec_id}/stdin).
  bool stdin_stream = false;
  if (body->is_object() && body->contains("stdin_stream")) {
    const json& flag = (*body)["stdin_stream"];
    if (!flag.is_boolean()) return ex.sendError(400, "invalid", "stdin_stream: expected true or false");
    stdin_stream = flag.get<bool>();
    body->erase("stdin_stream");
    if (stdin_stream && !stream) {
      return ex.sendError(400, "invalid", "stdin_stream: only a streamed exec (/exec/stream) takes stdin as it runs");
    }
    if (stdin_stream && (body->contains("stdin") || body->contains("stdin_b64"))) {
      return ex.sendError(400, "invalid", "stdin_stream: give stdin either as a stream or as data, not both");
    }
  }
  auto req = parseExecRequest(*body);
  if (!req.ok()) return sendError(ex, req.error());
  auto lease = agent_->use(id);
  if (!lease.ok()) return sendError(ex, lease.error());
  agent_->metrics().execs_total++;
  if (!stream) {
    // The output is collected within the node's output budget and escaped only as it is written.
    BufferedExecOutput output(&output_budget_);
    auto result = lease->sandbox().execStream(*req, output);
    if (!result.ok()) return sendError(ex, result.error());
    output.respond(ex, *result);
    return;
  }
  OpenedFeed opened;
  if (stdin_stream) {
    auto feed = stdin_feeds_.open(id);
    if (!feed.ok()) return sendError(ex, feed.error());
    opened = std::move(*feed);
    req->stdin_fd = opened.read_end.get();
  }
  const std::string exec_id = opened.exec_id;
  NdjsonSink sink(ex, exec_id, std::move(opened.read_end), &hangups_, std::move(opened.feed));
  auto result = lease->sandbox().execStream(*req, sink);
  if (!exec_id.empty()) stdin_feeds_.close(exec_id);
  if (!result.ok()) {
    if (!sink.started()) return sendError(ex, result.error());
    // Headers are out: report the failure as the last line.
    auto [status, code] = httpStatusFor(result.error().code());
    (void)status;
    sink.writeLast({{"error", {{"code", code}, {"message", result.error().message()}}}, {"done", true}});
    ex.endStream();
    return;
  }
  if (!sink.finish()) return;
  json last = execResultToJson(*result);
  last["stdout"] = "";
  last["stderr"] = "";
  last["done"] = true;
  if (sink.writeLast(last)) ex.endStream();
}

void ApiServer::execSignal(HttpExchange& ex, const std::string& id, const std::string& exec_id) {
  auto body = readJsonBody(ex, kJsonBodyLimit);
  if (!body) return;
  if (!body->is_object() || !body->contains("signal") || !(*body)["signal"].is_number_integer()) {
    return sendError(ex, Error::invalid("the body is {\"signal\": N} (1-64)"));
  }
  const int sig = (*body)["signal"].get<int>();
  if (sig < 1 || sig > 64) return sendError(ex, Error::invalid("signal must be 1-64, not " + std::to_string(sig)));
  auto feed = stdin_feeds_.find(id, exec_id);
  if (!feed.ok()) return sendError(ex, feed.error());
  if (Status st = (*feed)->signal(sig); !st.ok()) return sendError(ex, st.error());
  ex.sendJson(200, json{{"signal", sig}});
}

void ApiServer::execStdin(HttpExchange& ex, const std::string& id, const std::string& exec_id, bool eof) {
  auto feed = stdin_feeds_.find(id, exec_id);
  if (!feed.ok()) {
    ex.discardBody(kStdinBufferLimit);
    return sendError(ex, feed.error());
  }
  // What this write holds of the exec's stdin buffer is known before its body is read.
  auto length = ex.contentLength();
  if (ex.hasBody() && !length) {
    ex.forceClose();
    return ex.sendError(411, "length_required", "stdin writes need a Content-Length");
  }
  const uint64_t bytes = length.value_or(0);
  if (bytes > kStdinBufferLimit) {
    ex.discardBody(0);
    ex.forceClose();
    return ex.sendError(413, "too_large",
                        "a stdin write of " + std::to_string(bytes) + " bytes is over the limit of " +
                            std::to_string(kStdinBufferLimit) + " bytes per exec; write it in smaller pieces");
  }
  if (!(*feed)->reserve(bytes)) {
    ex.discardBody(kStdinBufferLimit);
    return ex.sendError(429, "capacity",
                        "the exec's stdin buffer (" + std::to_string(kStdinBufferLimit) +
                            " bytes) is full of earlier writes: wait for them to finish",
                        {{"Retry-After", "1"}}, json{{"retry_after", 1}, {"resource", "stdin_buffer"}});
  }
  bool too_large = false;
  auto data = ex.readBody(bytes, &too_large);
  if (!data.ok()) {
    (*feed)->release(bytes);
    if (!ex.responded()) sendError(ex, data.error());
    return;
  }
  uint64_t written = 0;
  Status st = (*feed)->write(*data, eof, &written);
  (*feed)->release(bytes);
  if (!st.ok()) {
    auto [status, code] = httpStatusFor(st.error().code());
    return ex.sendError(status, code, st.error().message() + " (" + std::to_string(written) + " bytes written)", {},
                        json{{"written", written}});
  }
  ex.sendJson(200, json{{"written", written}, {"eof", eof}});
}

}  // namespace dsec::launcher
