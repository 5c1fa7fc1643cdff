#include "dsec/launcher/api/Router.h"

#include "dsec/common/Strings.h"
#include "dsec/launcher/node/Sessions.h"

namespace dsec::launcher {
namespace {

namespace http = boost::beast::http;

struct MethodOp {
  http::verb verb;
  Op op;
};

bool validSandboxId(std::string_view id) {
  if (id.empty() || id.size() > 128) return false;
  for (char c : id) {
    bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.';
    if (!ok) return false;
  }
  return id != "." && id != "..";
}

int hexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string QueryParams::get(const std::string& key, const std::string& fallback) const {
  auto range = values.equal_range(key);
  if (range.first == range.second) return fallback;
  return std::prev(range.second)->second;
}

std::vector<std::string> QueryParams::all(const std::string& key) const {
  std::vector<std::string> out;
  auto range = values.equal_range(key);
  for (auto it = range.first; it != range.second; ++it) out.push_back(it->second);
  return out;
}

bool percentDecode(std::string_view in, std::string* out) {
  out->clear();
  out->reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    char c = in[i];
    if (c == '+') {
      out->push_back(' ');
    } else if (c == '%') {
      if (i + 2 >= in.size()) return false;
      int hi = hexValue(in[i + 1]), lo = hexValue(in[i + 2]);
      if (hi < 0 || lo < 0) return false;
      out->push_back(static_cast<char>(hi * 16 + lo));
      i += 2;
    } else {
      out->push_back(c);
    }
  }
  return true;
}

RouteMatch matchRoute(http::verb method, std::string_view target) {
  RouteMatch m;
  std::string_view path = target, query;
  if (auto q = target.find('?'); q != std::string_view::npos) {
    path = target.substr(0, q);
    query = target.substr(q + 1);
  }
  for (const auto& part : split(query, '&')) {
    if (part.empty()) continue;
    auto eq = part.find('=');
    std::string key, value;
    bool ok = percentDecode(std::string_view(part).substr(0, eq), &key);
    if (ok && eq != std::string::npos) ok = percentDecode(std::string_view(part).substr(eq + 1), &value);
    if (!ok) {
      m.error_status = 400;
      m.error = "malformed query string: bad percent-encoding in '" + part + "'";
      return m;
    }
    m.query.values.emplace(std::move(key), std::move(value));
  }
  if (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  std::vector<std::string> segs;
  for (auto& s : split(path, '/')) {
    if (!s.empty()) segs.push_back(s);
  }

  std::vector<MethodOp> candidates;
  auto is = [&segs](std::initializer_list<const char*> want) {
    if (segs.size() != want.size()) return false;
    size_t i = 0;
    for (const char* w : want) {
      if (std::string_view(w) != "*" && segs[i] != w) return false;
      ++i;
    }
    return true;
  };
  if (is({"healthz"})) {
    candidates = {{http::verb::get, Op::kHealthz}};
  } else if (is({"metrics"})) {
    candidates = {{http::verb::get, Op::kMetrics}};
  } else if (is({"v1", "node"})) {
    candidates = {{http::verb::get, Op::kNodeInfo}};
  } else if (is({"v1", "layers"})) {
    candidates = {{http::verb::get, Op::kListLayers}};
  } else if (is({"v1", "call"})) {
    candidates = {{http::verb::post, Op::kCall}};
  } else if (is({"v1", "sandboxes"})) {
    candidates = {{http::verb::get, Op::kListSandboxes}, {http::verb::post, Op::kCreateSandbox}};
  } else if (segs.size() >= 3 && segs[0] == "v1" && segs[1] == "sandboxes") {
    if (is({"v1", "sandboxes", "*"})) {
      candidates = {{http::verb::get, Op::kGetSandbox}, {http::verb::delete_, Op::kDestroySandbox}};
    } else if (is({"v1", "sandboxes", "*", "pause"})) {
      candidates = {{http::verb::post, Op::kPause}};
    } else if (is({"v1", "sandboxes", "*", "resume"})) {
      candidates = {{http::verb::post, Op::kResume}};
    } else if (is({"v1", "sandboxes", "*", "exec"})) {
      candidates = {{http::verb::post, Op::kExec}};
    } else if (is({"v1", "sandboxes", "*", "exec", "stream"})) {
      candidates = {{http::verb::post, Op::kExecStream}};
    } else if (is({"v1", "sandboxes", "*", "files"})) {
      candidates = {
          {http::verb::get, Op::kReadFile}, {http::verb::put, Op::kWriteFile}, {http::verb::delete_, Op::kRemoveFile}};
    } else if (is({"v1", "sandboxes", "*", "files", "list"})) {
      candidates = {{http::verb::get, Op::kListDir}};
    } else if (is({"v1", "sandboxes", "*", "files", "stat"})) {
      candidates = {{http::verb::get, Op::kStatFile}};
    } else if (is({"v1", "sandboxes", "*", "tar"})) {
      candidates = {{http::verb::get, Op::kGetTar}, {http::verb::put, Op::kPutTar}};
    }
    if (!candidates.empty()) {
      std::string id;
      if (!percentDecode(segs[2], &id) || !validSandboxId(id)) {
        m.error_status = 404;
        m.error = "no sandbox '" + segs[2] + "' (not a valid sandbox id)";
        return m;
      }
      m.sandbox_id = std::move(id);
    }
  }
  if (is({"v1", "sessions"})) {
    candidates = {{http::verb::get, Op::kListSessions}};
  } else if (is({"v1", "sessions", "*"}) || is({"v1", "sessions", "*", "attach"})) {
    if (segs.size() == 3) {
      candidates = {{http::verb::get, Op::kGetSession},
                    {http::verb::put, Op::kPutSession},
                    {http::verb::delete_, Op::kDeleteSession}};
    } else {
      candidates = {{http::verb::post, Op::kAttachSession}};
    }
    std::string name;
    if (!percentDecode(segs[2], &name)) name = segs[2];
    if (auto st = validateSessionName(name); !st.ok()) {
      m.error_status = 400;
      m.error = st.error().message();
      return m;
    }
    m.session = std::move(name);
  }
  if (candidates.empty()) {
    m.error_status = 404;
    m.error = "no route " + std::string(path);
    return m;
  }
  for (const auto& c : candidates) {
    // HEAD is not part of the API; GET-only routes stay GET-only so the contract has one answer per route.
    if (c.verb == method) {
      m.op = c.op;
      return m;
    }
  }
  m.error_status = 405;
  for (const auto& c : candidates) {
    if (!m.allow.empty()) m.allow += ", ";
    m.allow += std::string(http::to_string(c.verb));
  }
  m.error = "method " + std::string(http::to_string(method)) + " not allowed on " + std::string(path) +
            " (allowed: " + m.allow + ")";
  return m;
}

BodyKind bodyKind(Op op) {
  switch (op) {
    case Op::kCreateSandbox:
    case Op::kExec:
    case Op::kExecStream:
    case Op::kPutSession:
    case Op::kAttachSession:
    case Op::kCall:
      return BodyKind::kJson;
    case Op::kWriteFile:
    case Op::kPutTar:
      return BodyKind::kStream;
    default:
      return BodyKind::kNone;
  }
}

const char* opName(Op op) {
  switch (op) {
    case Op::kHealthz:
      return "healthz";
    case Op::kMetrics:
      return "metrics";
    case Op::kNodeInfo:
      return "node";
    case Op::kListLayers:
      return "layers";
    case Op::kListSandboxes:
      return "list";
    case Op::kCreateSandbox:
      return "create";
    case Op::kGetSandbox:
      return "get";
    case Op::kDestroySandbox:
      return "destroy";
    case Op::kPause:
      return "pause";
    case Op::kResume:
      return "resume";
    case Op::kExec:
      return "exec";
    case Op::kExecStream:
      return "exec-stream";
    case Op::kReadFile:
      return "read-file";
    case Op::kWriteFile:
      return "write-file";
    case Op::kRemoveFile:
      return "remove-file";
    case Op::kListDir:
      return "list-dir";
    case Op::kStatFile:
      return "stat";
    case Op::kGetTar:
      return "get-tar";
    case Op::kPutTar:
      return "put-tar";
    case Op::kListSessions:
      return "list-sessions";
    case Op::kPutSession:
      return "put-session";
    case Op::kGetSession:
      return "get-session";
    case Op::kDeleteSession:
      return "delete-session";
    case Op::kAttachSession:
      return "attach-session";
    case Op::kCall:
      return "call";
  }
  return "?";
}

}  // namespace dsec::launcher
