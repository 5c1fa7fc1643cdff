// E2B's envd, played from outside the sandbox (docs/e2b.md): the Connect services process.Process and
// filesystem.Filesystem (JSON codec) and envd's /files, each turned into calls of the dsec API.
#include <cstring>

#include "E2bText.h"
#include "dsec/common/Base64.h"
#include "dsec/common/Strings.h"
#include "dsec/launcher/api/ConnectEnvelope.h"
#include "dsec/launcher/api/E2bFront.h"
#include "dsec/launcher/api/HttpClient.h"
#include "dsec/launcher/api/Requests.h"
#include "dsec/launcher/api/Router.h"

namespace dsec::launcher {
namespace {

namespace http = boost::beast::http;
using e2b::header;

constexpr uint64_t kRpcBodyLimit = 1 << 20;
constexpr uint64_t kUploadLimit = 256ull << 20;

// A Connect error of a unary call: its HTTP status and {"code", "message"}.
void sendConnectError(HttpExchange& ex, const std::string& code, const std::string& message) {
  static const std::map<std::string, int> kStatus = {
      {"invalid_argument", 400}, {"unauthenticated", 401},    {"permission_denied", 403}, {"not_found", 404},
      {"already_exists", 409},   {"resource_exhausted", 429}, {"unimplemented", 501},     {"unavailable", 503},
      {"internal", 500},         {"deadline_exceeded", 504}};
  auto it = kStatus.find(code);
  ex.sendJson(it == kStatus.end() ? 500 : it->second, nlohmann::json{{"code", code}, {"message", message}});
}

// A dsec API status as a Connect code.
std::string connectCode(int status) {
  switch (status) {
    case 400:
    case 413:
      return "invalid_argument";
    case 401:
      return "unauthenticated";
    case 404:
      return "not_found";
    case 409:
      return "already_exists";
    case 429:
      return "resource_exhausted";
    case 503:
      return "unavailable";
    case 504:
      return "deadline_exceeded";
    default:
      return "internal";
  }
}

std::string errorMessage(const std::string& body, int status) {
  auto j = nlohmann::json::parse(body, nullptr, false);
  if (j.is_object() && j.contains("error") && j["error"].is_object()) return j["error"].value("message", "");
  return "dsec answered HTTP " + std::to_string(status);
}

std::string baseName(const std::string& path) {
  auto slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// A dsec file entry as envd's EntryInfo.
nlohmann::json entryInfo(const nlohmann::json& e, const std::string& path) {
  const std::string type = e.value("type", "file");
  const char* e2b_type = type == "dir"       ? "FILE_TYPE_DIRECTORY"
                         : type == "symlink" ? "FILE_TYPE_SYMLINK"
                                             : "FILE_TYPE_FILE";
  const auto mode = e.value("mode", 0u);
  std::string permissions = type == "dir" ? "d" : "-";
  for (int shift = 6; shift >= 0; shift -= 3) {
    permissions += (mode >> (shift + 2)) & 1 ? 'r' : '-';
    permissions += (mode >> (shift + 1)) & 1 ? 'w' : '-';
    permissions += (mode >> shift) & 1 ? 'x' : '-';
  }
  return nlohmann::json{{"name", e.value("name", baseName(path))},
                        {"type", e2b_type},
                        {"path", path},
                        {"size", std::to_string(e.value("size", int64_t{0}))},
                        {"mode", mode},
                        {"permissions", permissions},
                        {"owner", "root"},
                        {"group", "root"},
                        {"modifiedTime", rfc3339(static_cast<double>(e.value("mtime", int64_t{0})))}};
}

// The files of a multipart/form-data body: (filename, bytes) of each part.
Result<std::vector<std::pair<std::string, std::string>>> multipartFiles(const std::string& content_type,
                                                                        const std::string& body) {
  const auto at = content_type.find("boundary=");
  if (at == std::string::npos) return Error::invalid("multipart body without a boundary");
  std::string boundary = content_type.substr(at + 9);
  if (auto semi = boundary.find(';'); semi != std::string::npos) boundary.resize(semi);
  if (boundary.size() >= 2 && boundary.front() == '"' && boundary.back() == '"') {
    boundary = boundary.substr(1, boundary.size() - 2);
  }
  const std::string delimiter = "--" + boundary;
  std::vector<std::pair<std::string, std::string>> out;
  size_t pos = body.find(delimiter);
  while (pos != std::string::npos) {
    pos += delimiter.size();
    if (body.compare(pos, 2, "--") == 0) break;  // the closing delimiter
    const size_t head_end = body.find("\r\n\r\n", pos);
    if (head_end == std::string::npos) return Error::invalid("a multipart part without its headers' end");
    const std::string head = body.substr(pos, head_end - pos);
    const size_t next = body.find("\r\n" + delimiter, head_end + 4);
    if (next == std::string::npos) return Error::invalid("a multipart part without its end");
    std::string filename;
    if (auto f = head.find("filename=\""); f != std::string::npos) {
      filename = head.substr(f + 10, head.find('"', f + 10) - f - 10);
    }
    out.emplace_back(filename, body.substr(head_end + 4, next - head_end - 4));
    pos = next + 2;
  }
  return out;
}

}  // namespace

void E2bFront::envd(HttpExchange& ex, const std::string& sandbox_id) {
  if (!validSandboxId(sandbox_id) || token_.empty() ||
      !constantTimeEquals(header(ex, "X-Access-Token"), envdAccessToken(token_, sandbox_id))) {
    if (ex.hasBody()) ex.forceClose();
    return sendConnectError(ex, "unauthenticated", "the sandbox's envdAccessToken is missing or wrong");
  }
  ex.markAuthenticated();
  std::string_view target = ex.target();
  std::string_view path = target.substr(0, target.find('?'));
  if (path == "/health") return ex.sendText(204, "application/json", "");
  if (path == "/files") {
    if (ex.method() == http::verb::get) return readFile(ex, sandbox_id);
    if (ex.method() == http::verb::post) return writeFile(ex, sandbox_id);
  }
  if (path == "/process.Process/Start" && ex.method() == http::verb::post) return processStart(ex, sandbox_id);
  constexpr std::string_view kProcess = "/process.Process/";
  if (path.substr(0, kProcess.size()) == kProcess && ex.method() == http::verb::post) {
    const std::string method(path.substr(kProcess.size()));
    if (method == "SendSignal" || method == "SendInput" || method == "CloseStdin") {
      return processControl(ex, sandbox_id, method);
    }
  }
  constexpr std::string_view kFilesystem = "/filesystem.Filesystem/";
  if (path.substr(0, kFilesystem.size()) == kFilesystem && ex.method() == http::verb::post) {
    return filesystemCall(ex, sandbox_id, std::string(path.substr(kFilesystem.size())));
  }
  if (ex.hasBody() && !ex.discardBody(kRpcBodyLimit)) ex.forceClose();
  sendConnectError(ex, "unimplemented",
                   std::string(path.substr(0, 200)) + " is not supported by dsec's E2B listener (docs/e2b.md)");
}

void E2bFront::processStart(HttpExchange& ex, const std::string& id) {
  bool too_large = false;
  auto body = ex.readBody(kRpcBodyLimit, &too_large);
  auto fail = [&](const std::string& code, const std::string& message) {
    // A stream's error travels in its end-of-stream message (the response itself is 200).
    if (!ex.streamOpen()) ex.beginStream(200, "application/connect+json", std::nullopt);
    const auto end = nlohmann::json{{"error", {{"code", code}, {"message", message}}}}.dump();
    const std::string frame = connectFrame(kConnectEndStream, end);
    ex.writeStream(frame.data(), frame.size());
    ex.endStream();
  };
  if (!body.ok()) return fail("invalid_argument", body.error().message());
  auto frames = parseConnectFrames(*body);
  if (!frames.ok() || frames->empty()) {
    return fail("invalid_argument", frames.ok() ? "no StartRequest" : frames.error().message());
  }
  auto request = nlohmann::json::parse(frames->front().json, nullptr, false);
  if (!request.is_object() || !request.contains("process") || !request["process"].is_object()) {
    return fail("invalid_argument", "a StartRequest needs its process");
  }
  if (request.contains("pty") && !request["pty"].is_null()) {
    return fail("unimplemented", "pty commands are not supported by dsec's E2B listener (docs/e2b.md)");
  }
  const auto& process = request["process"];
  nlohmann::json argv = nlohmann::json::array({process.value("cmd", "")});
  if (process.contains("args") && process["args"].is_array()) {
    for (const auto& a : process["args"]) argv.push_back(a);
  }
  // Always a stdin stream: it names the exec (for signals and input); a command given no stdin gets EOF at once.
  const bool wants_stdin = request.value("stdin", false);
  nlohmann::json exec{{"cmd", argv}, {"stdin_stream", true}};
  if (process.contains("envs") && process["envs"].is_object()) exec["env"] = process["envs"];
  if (process.contains("cwd") && process["cwd"].is_string() && !process["cwd"].get<std::string>().empty()) {
    exec["cwd"] = process["cwd"];
  }
  const uint32_t pid = next_pid_++;
  std::string pending;  // an NDJSON line not yet complete
  bool client_gone = false;
  bool started = false;
  bool finished = false;  // the end-of-stream message went out
  std::string exec_id;
  const std::string exec_base = "/v1/sandboxes/" + id + "/exec/";
  auto send = [&](uint8_t flags, const nlohmann::json& message) {
    if (!ex.streamOpen() && !ex.beginStream(200, "application/connect+json", std::nullopt)) return false;
    const std::string frame = connectFrame(flags, message.dump());
    return ex.writeStream(frame.data(), frame.size());
  };
  auto on_line = [&](const std::string& line) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object()) return true;
    // The start event comes first, whatever the first line is (a command that cannot start still ends here).
    if (!started && !send(0, {{"event", {{"start", {{"pid", pid}}}}}})) return false;
    started = true;
    if (j.contains("started")) {
      exec_id = j.value("exec_id", "");
      if (!exec_id.empty()) {
        std::lock_guard lock(procs_mu_);
        procs_[pid] = {id, exec_id};
      }
      if (!wants_stdin && !exec_id.empty()) (void)call(http::verb::post, exec_base + exec_id + "/stdin?eof=true", "");
      return true;
    }
    if (!j.value("done", false)) {
      for (const char* stream : {"stdout", "stderr"}) {
        if (j.contains(stream) && j[stream].is_string() && !j[stream].get<std::string>().empty()) {
          return send(0, {{"event", {{"data", {{stream, base64Encode(j[stream].get<std::string>())}}}}}});
        }
      }
      return true;
    }
    {
      if (j.contains("error")) {
        send(kConnectEndStream, {{"error", {{"code", "internal"}, {"message", j["error"].value("message", "")}}}});
        finished = true;
        return false;
      }
      const int code = j.value("exit_code", -1);
      const int sig = j.value("signal", 0);
      nlohmann::json end{
          {"exitCode", code},
          {"exited", sig == 0},
          {"status", sig == 0 ? "exit status " + std::to_string(code) : "signal: " + std::to_string(sig)}};
      if (j.value("timed_out", false)) end["error"] = "the command timed out";
      if (!send(0, {{"event", {{"end", end}}}})) return false;
      send(kConnectEndStream, nlohmann::json::object());
      finished = true;
      return false;  // the stream is complete
    }
    return true;
  };
  client::CallOptions options;
  options.io_timeout_ms = -1;  // a command may be silent for as long as it runs
  options.headers.emplace_back("Content-Type", "application/json");
  auto reply =
      client::callStreaming(upstream_, http::verb::post, "/v1/sandboxes/" + id + "/exec/stream", token_, exec.dump(),
                            options, [&](const char* data, size_t size) {
                              pending.append(data, size);
                              for (size_t nl = pending.find('\n'); nl != std::string::npos; nl = pending.find('\n')) {
                                std::string line = pending.substr(0, nl);
                                pending.erase(0, nl + 1);
                                if (!on_line(line)) {
                                  client_gone = !ex.streamOpen() || ex.broken();
                                  return false;
                                }
                              }
                              return true;
                            });
  {
    std::lock_guard lock(procs_mu_);
    procs_.erase(pid);
  }
  if (ex.streamOpen()) {
    if (!finished) {
      fail("unavailable", reply.ok() ? "the command's stream ended early" : reply.error().message());
    } else {
      ex.endStream();
    }
    return;
  }
  if (client_gone) return;
  if (!reply.ok()) return fail("unavailable", reply.error().message());
  fail(connectCode(reply->status), errorMessage(reply->body, reply->status));
}

void E2bFront::processControl(HttpExchange& ex, const std::string& id, const std::string& method) {
  bool too_large = false;
  auto body = ex.readBody(kRpcBodyLimit, &too_large);
  if (!body.ok()) return sendConnectError(ex, "invalid_argument", body.error().message());
  auto j = nlohmann::json::parse(body->empty() ? "{}" : *body, nullptr, false);
  if (!j.is_object() || !j.contains("process") || !j["process"].is_object() || !j["process"].contains("pid")) {
    return sendConnectError(ex, "invalid_argument", "a process selector {\"pid\"} is needed (tags are not kept)");
  }
  const auto pid = j["process"]["pid"].is_number() ? j["process"]["pid"].get<uint32_t>() : 0u;
  std::string exec_id;
  {
    std::lock_guard lock(procs_mu_);
    auto it = procs_.find(pid);
    if (it != procs_.end() && it->second.first == id) exec_id = it->second.second;
  }
  if (exec_id.empty()) return sendConnectError(ex, "not_found", "no running process " + std::to_string(pid));
  const std::string base = "/v1/sandboxes/" + id + "/exec/" + exec_id;
  Upstream answer;
  if (method == "SendSignal") {
    // process.Signal: SIGNAL_SIGTERM = 15, SIGNAL_SIGKILL = 9 (by name or number in JSON).
    int sig = 0;
    if (j.contains("signal") && j["signal"].is_number_integer()) sig = j["signal"].get<int>();
    if (j.contains("signal") && j["signal"].is_string()) {
      const std::string name = j["signal"].get<std::string>();
      sig = name == "SIGNAL_SIGKILL" ? 9 : name == "SIGNAL_SIGTERM" ? 15 : 0;
    }
    if (sig != 9 && sig != 15) return sendConnectError(ex, "invalid_argument", "signal must be SIGTERM or SIGKILL");
    answer = call(http::verb::post, base + "/signal", nlohmann::json{{"signal", sig}}.dump());
  } else if (method == "SendInput") {
    std::string data;
    if (j.contains("input") && j["input"].is_object() && j["input"].contains("stdin")) {
      auto decoded = base64Decode(j["input"].value("stdin", ""));
      if (!decoded.ok()) return sendConnectError(ex, "invalid_argument", "input.stdin is not base64");
      data = std::move(*decoded);
    } else {
      return sendConnectError(ex, "unimplemented", "only stdin input is supported (no pty)");
    }
    client::CallOptions options;
    options.headers.emplace_back("Content-Type", "application/octet-stream");
    auto reply = client::call(upstream_, http::verb::post, base + "/stdin", token_, data, options);
    answer = reply.ok() ? Upstream{reply->status, reply->body, {}} : Upstream{503, reply.error().message(), {}};
  } else {
    answer = call(http::verb::post, base + "/stdin?eof=true", "");
  }
  if (answer.status / 100 != 2) {
    return sendConnectError(ex, connectCode(answer.status), errorMessage(answer.body, answer.status));
  }
  ex.sendJson(200, nlohmann::json::object());
}

void E2bFront::filesystemCall(HttpExchange& ex, const std::string& id, const std::string& method) {
  bool too_large = false;
  auto body = ex.readBody(kRpcBodyLimit, &too_large);
  if (!body.ok()) return sendConnectError(ex, "invalid_argument", body.error().message());
  auto j = nlohmann::json::parse(body->empty() ? "{}" : *body, nullptr, false);
  if (!j.is_object()) return sendConnectError(ex, "invalid_argument", "the request is not a JSON object");
  const std::string base = "/v1/sandboxes/" + id;
  auto stat = [&](const std::string& path) {
    return call(http::verb::get, base + "/files/stat?path=" + percentEncode(path, true), "");
  };
  auto failed = [&](const Upstream& answer) {
    sendConnectError(ex, connectCode(answer.status), errorMessage(answer.body, answer.status));
  };
  auto run = [&](const nlohmann::json& argv) {
    return call(http::verb::post, base + "/exec", nlohmann::json{{"cmd", argv}, {"timeout", 60}}.dump());
  };
  const std::string path = j.value("path", "");
  if (method == "Stat") {
    auto answer = stat(path);
    if (answer.status != 200) return failed(answer);
    return ex.sendJson(200, {{"entry", entryInfo(nlohmann::json::parse(answer.body), path)}});
  }
  if (method == "ListDir") {
    auto answer = call(http::verb::get, base + "/files/list?path=" + percentEncode(path, true), "");
    if (answer.status != 200) return failed(answer);
    nlohmann::json entries = nlohmann::json::array();
    for (const auto& e : nlohmann::json::parse(answer.body).value("entries", nlohmann::json::array())) {
      const std::string child = (path.size() > 1 && path.back() == '/' ? path.substr(0, path.size() - 1) : path) +
                                (path == "/" ? "" : "/") + e.value("name", "");
      entries.push_back(entryInfo(e, child));
    }
    return ex.sendJson(200, {{"entries", entries}});
  }
  if (method == "MakeDir") {
    if (stat(path).status == 200) return sendConnectError(ex, "already_exists", path + " exists");
    auto made = run({"mkdir", "-p", "--", path});
    if (made.status != 200) return failed(made);
    auto j_made = nlohmann::json::parse(made.body, nullptr, false);
    if (j_made.value("exit_code", -1) != 0) {
      return sendConnectError(ex, "invalid_argument", "mkdir " + path + ": " + j_made.value("stderr", ""));
    }
    auto answer = stat(path);
    if (answer.status != 200) return failed(answer);
    return ex.sendJson(200, {{"entry", entryInfo(nlohmann::json::parse(answer.body), path)}});
  }
  if (method == "Remove") {
    auto answer = call(http::verb::delete_, base + "/files?path=" + percentEncode(path, true) + "&recursive=1", "");
    if (answer.status != 200) return failed(answer);
    return ex.sendJson(200, nlohmann::json::object());
  }
  if (method == "Move") {
    const std::string from = j.value("source", ""), to = j.value("destination", "");
    if (stat(from).status != 200) return sendConnectError(ex, "not_found", from + " not found");
    auto moved = run({"mv", "--", from, to});
    if (moved.status != 200) return failed(moved);
    auto answer = stat(to);
    if (answer.status != 200) return failed(answer);
    return ex.sendJson(200, {{"entry", entryInfo(nlohmann::json::parse(answer.body), to)}});
  }
  sendConnectError(ex, "unimplemented", "filesystem." + method + " is not supported by dsec's E2B listener");
}

void E2bFront::readFile(HttpExchange& ex, const std::string& id) {
  auto query = queryOf(ex.target());
  const std::string path = query.ok() ? query->get("path") : "";
  if (path.empty()) return ex.sendJson(400, {{"code", 400}, {"message", "path is required"}});
  client::CallOptions options;
  options.io_timeout_ms = 600 * 1000;
  bool began = false;
  auto reply = client::callStreaming(upstream_, http::verb::get,
                                     "/v1/sandboxes/" + id + "/files?path=" + percentEncode(path, true), token_, "",
                                     options, [&](const char* data, size_t size) {
                                       if (!began) {
                                         began = true;
                                         if (!ex.beginStream(200, "application/octet-stream", std::nullopt))
                                           return false;
                                       }
                                       return ex.writeStream(data, size);
                                     });
  if (began || ex.streamOpen()) {
    if (ex.streamOpen()) ex.endStream();
    return;
  }
  if (!reply.ok()) return ex.sendJson(502, {{"code", 502}, {"message", reply.error().message()}});
  if (reply->status / 100 == 2) return ex.sendText(200, "application/octet-stream", "");  // an empty file
  ex.sendJson(reply->status, {{"code", reply->status}, {"message", errorMessage(reply->body, reply->status)}});
}

void E2bFront::writeFile(HttpExchange& ex, const std::string& id) {
  auto query = queryOf(ex.target());
  if (!query.ok()) {
    ex.forceClose();
    return ex.sendJson(400, {{"code", 400}, {"message", query.error().message()}});
  }
  const std::string path = query->get("path");
  bool too_large = false;
  auto body = ex.readBody(kUploadLimit, &too_large);
  if (!body.ok()) {
    ex.forceClose();
    return ex.sendJson(too_large ? 413 : 400, {{"code", too_large ? 413 : 400}, {"message", body.error().message()}});
  }
  std::vector<std::pair<std::string, std::string>> files;
  const std::string content_type = header(ex, "Content-Type");
  if (content_type.rfind("multipart/form-data", 0) == 0) {
    auto parts = multipartFiles(content_type, *body);
    if (!parts.ok()) return ex.sendJson(400, {{"code", 400}, {"message", parts.error().message()}});
    files = std::move(*parts);
  } else {
    files.emplace_back(path, std::move(*body));
  }
  nlohmann::json written = nlohmann::json::array();
  for (auto& [name, data] : files) {
    const std::string target_path = path.empty() ? name : path;
    if (target_path.empty() || target_path[0] != '/') {
      return ex.sendJson(400, {{"code", 400}, {"message", "a file needs an absolute path"}});
    }
    client::CallOptions options;
    options.io_timeout_ms = 600 * 1000;
    options.headers.emplace_back("Content-Type", "application/octet-stream");
    auto reply =
        client::call(upstream_, http::verb::put,
                     "/v1/sandboxes/" + id + "/files?path=" + percentEncode(target_path, true), token_, data, options);
    if (!reply.ok()) return ex.sendJson(502, {{"code", 502}, {"message", reply.error().message()}});
    if (reply->status / 100 != 2) {
      return ex.sendJson(reply->status,
                         {{"code", reply->status}, {"message", errorMessage(reply->body, reply->status)}});
    }
    written.push_back({{"name", baseName(target_path)}, {"type", "file"}, {"path", target_path}});
  }
  ex.sendJson(200, written);
}

}  // namespace dsec::launcher
