#include "dsec/launcher/api/Router.h"

#include "dsec/common/Strings.h"
#include "dsec/launcher/node/Sessions.h"

namespace dsec::launcher {
namespace {

namespace http = boost::beast::http;

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

RouteTable& RouteTable::add(std::string_view pattern, std::initializer_list<Method> methods) {
  Entry e;
  for (auto& seg : split(pattern, '/')) {
    if (!seg.empty()) e.segments.push_back(seg);
  }
  e.methods = methods;
  entries_.push_back(std::move(e));
  return *this;
}

RouteTable& RouteTable::addAnyMethod(std::string_view pattern, int route) {
  add(pattern, {});
  entries_.back().any_method_route = route;
  return *this;
}

Result<QueryParams> parseQuery(std::string_view query) {
  QueryParams params;
  for (const auto& part : split(query, '&')) {
    if (part.empty()) continue;
    auto eq = part.find('=');
    std::string key, value;
    bool ok = percentDecode(std::string_view(part).substr(0, eq), &key);
    if (ok && eq != std::string::npos) ok = percentDecode(std::string_view(part).substr(eq + 1), &value);
    if (!ok) return Error::invalid("malformed query string: bad percent-encoding in '" + part + "'");
    params.values.emplace(std::move(key), std::move(value));
  }
  return params;
}

Result<QueryParams> queryOf(std::string_view target) {
  const auto q = target.find('?');
  return parseQuery(q == std::string_view::npos ? std::string_view() : target.substr(q + 1));
}

TableMatch RouteTable::match(http::verb method, std::string_view target) const {
  TableMatch m;
  std::string_view path = target, query;
  if (auto q = target.find('?'); q != std::string_view::npos) {
    path = target.substr(0, q);
    query = target.substr(q + 1);
  }
  auto params = parseQuery(query);
  if (!params.ok()) {
    m.error_status = 400;
    m.error = params.error().message();
    return m;
  }
  m.query = std::move(*params);
  if (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  m.path = std::string(path);
  std::vector<std::string> segs;
  for (auto& s : split(path, '/')) {
    if (!s.empty()) segs.push_back(s);
  }
  for (const auto& e : entries_) {
    bool rest = !e.segments.empty() && e.segments.back() == "**";
    size_t fixed = rest ? e.segments.size() - 1 : e.segments.size();
    if (rest ? segs.size() <= fixed : segs.size() != fixed) continue;
    std::vector<std::string> wild;
    bool ok = true;
    for (size_t i = 0; i < fixed && ok; ++i) {
      if (e.segments[i] == "*") {
        wild.push_back(segs[i]);
      } else {
        ok = e.segments[i] == segs[i];
      }
    }
    if (!ok) continue;
    if (rest) {
      std::string tail;
      for (size_t i = fixed; i < segs.size(); ++i) tail += (tail.empty() ? "" : "/") + segs[i];
      wild.push_back(std::move(tail));
    }
    m.wildcards = std::move(wild);
    if (e.any_method_route >= 0) {
      m.route = e.any_method_route;
      return m;
    }
    // HEAD is not part of the API; GET-only routes stay GET-only so the contract has one answer per route.
    for (const auto& c : e.methods) {
      if (c.verb == method) {
        m.route = c.route;
        return m;
      }
    }
    m.route = e.methods.empty() ? -1 : e.methods.front().route;
    m.error_status = 405;
    for (const auto& c : e.methods) {
      if (!m.allow.empty()) m.allow += ", ";
      m.allow += std::string(http::to_string(c.verb));
    }
    m.error =
        "method " + std::string(http::to_string(method)) + " not allowed on " + m.path + " (allowed: " + m.allow + ")";
    return m;
  }
  m.error_status = 404;
  m.error = "no route " + m.path;
  return m;
}

namespace {

const RouteTable& nodeRoutes() {
  using V = http::verb;
  auto op = [](Op o) { return static_cast<int>(o); };
  static const RouteTable table = [&] {
    RouteTable t;
    t.add("/healthz", {{V::get, op(Op::kHealthz)}})
        .add("/metrics", {{V::get, op(Op::kMetrics)}})
        .add("/v1/node", {{V::get, op(Op::kNodeInfo)}})
        .add("/v1/layers", {{V::get, op(Op::kListLayers)}})
        .add("/v1/call", {{V::post, op(Op::kCall)}})
        .add("/run_code", {{V::post, op(Op::kRunCode)}})
        .add("/v1/sandboxes", {{V::get, op(Op::kListSandboxes)}, {V::post, op(Op::kCreateSandbox)}})
        .add("/v1/sandboxes/*", {{V::get, op(Op::kGetSandbox)}, {V::delete_, op(Op::kDestroySandbox)}})
        .add("/v1/sandboxes/*/pause", {{V::post, op(Op::kPause)}})
        .add("/v1/sandboxes/*/resume", {{V::post, op(Op::kResume)}})
        .add("/v1/sandboxes/*/network", {{V::put, op(Op::kSetNetwork)}})
        .add("/v1/sandboxes/*/protect", {{V::put, op(Op::kSetProtect)}})
        .add("/v1/sandboxes/*/timeout", {{V::put, op(Op::kSetTimeout)}})
        .add("/v1/sandboxes/*/violations", {{V::get, op(Op::kViolations)}})
        .add("/v1/sandboxes/*/exec", {{V::post, op(Op::kExec)}})
        .add("/v1/sandboxes/*/exec/stream", {{V::post, op(Op::kExecStream)}})
        .add("/v1/sandboxes/*/exec/*/stdin", {{V::post, op(Op::kExecStdin)}})
        .add("/v1/sandboxes/*/exec/*/signal", {{V::post, op(Op::kExecSignal)}})
        .add("/v1/sandboxes/*/terminal", {{V::get, op(Op::kTerminal)}})
        .add("/v1/sandboxes/*/files",
             {{V::get, op(Op::kReadFile)}, {V::put, op(Op::kWriteFile)}, {V::delete_, op(Op::kRemoveFile)}})
        .add("/v1/sandboxes/*/files/list", {{V::get, op(Op::kListDir)}})
        .add("/v1/sandboxes/*/files/stat", {{V::get, op(Op::kStatFile)}})
        .add("/v1/sandboxes/*/tar", {{V::get, op(Op::kGetTar)}, {V::put, op(Op::kPutTar)}})
        .add("/v1/sessions", {{V::get, op(Op::kListSessions)}})
        .add("/v1/sessions/*",
             {{V::get, op(Op::kGetSession)}, {V::put, op(Op::kPutSession)}, {V::delete_, op(Op::kDeleteSession)}})
        .add("/v1/sessions/*/attach", {{V::post, op(Op::kAttachSession)}})
        .add("/v1/sandboxes/*/snapshot", {{V::post, op(Op::kSnapshotSandbox)}})
        .add("/v1/sandboxes/*/fork", {{V::post, op(Op::kForkSandbox)}})
        .add("/v1/snapshots", {{V::get, op(Op::kListSnapshots)}})
        .add("/v1/snapshots/*", {{V::get, op(Op::kGetSnapshot)}, {V::delete_, op(Op::kDeleteSnapshot)}});
    return t;
  }();
  return table;
}

}  // namespace

bool validSandboxId(std::string_view id) {
  if (id.empty() || id.size() > 128) return false;
  for (char c : id) {
    bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.';
    if (!ok) return false;
  }
  return id != "." && id != "..";
}

RouteMatch matchRoute(http::verb method, std::string_view target) {
  TableMatch t = nodeRoutes().match(method, target);
  RouteMatch m;
  m.query = std::move(t.query);
  if (t.route >= 0) m.op = static_cast<Op>(t.route);
  // The id or name a route names is checked before its method: a bad one is the answer either way.
  bool session_route =
      m.op == Op::kGetSession || m.op == Op::kPutSession || m.op == Op::kDeleteSession || m.op == Op::kAttachSession;
  bool snapshot_route = m.op == Op::kGetSnapshot || m.op == Op::kDeleteSnapshot;
  if (t.route >= 0 && snapshot_route) {
    if (!percentDecode(t.wildcards[0], &m.snapshot)) m.snapshot = t.wildcards[0];
  } else if (t.route >= 0 && !t.wildcards.empty() && !session_route) {
    std::string id;
    if (!percentDecode(t.wildcards[0], &id) || !validSandboxId(id)) {
      m.error_status = 404;
      m.error = "no sandbox '" + t.wildcards[0] + "' (not a valid sandbox id)";
      return m;
    }
    m.sandbox_id = std::move(id);
    if (t.wildcards.size() > 1) m.sub_id = t.wildcards[1];
  } else if (t.route >= 0 && session_route) {
    std::string name;
    if (!percentDecode(t.wildcards[0], &name)) name = t.wildcards[0];
    if (auto st = validateSessionName(name); !st.ok()) {
      m.error_status = 400;
      m.error = st.error().message();
      return m;
    }
    m.session = std::move(name);
  }
  m.error_status = t.error_status;
  m.error = std::move(t.error);
  m.allow = std::move(t.allow);
  return m;
}

BodyKind bodyKind(Op op) {
  switch (op) {
    case Op::kCreateSandbox:
    case Op::kSetNetwork:
    case Op::kSetProtect:
    case Op::kSetTimeout:
    case Op::kExec:
    case Op::kExecStream:
    case Op::kPutSession:
    case Op::kAttachSession:
    case Op::kCall:
    case Op::kRunCode:
    case Op::kSnapshotSandbox:
    case Op::kForkSandbox:
    case Op::kExecSignal:
      return BodyKind::kJson;
    case Op::kWriteFile:
    case Op::kPutTar:
    case Op::kExecStdin:
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
    case Op::kSetNetwork:
      return "set-network";
    case Op::kSetProtect:
      return "set-protect";
    case Op::kSetTimeout:
      return "set-timeout";
    case Op::kViolations:
      return "violations";
    case Op::kExec:
      return "exec";
    case Op::kExecStream:
      return "exec-stream";
    case Op::kExecStdin:
      return "exec-stdin";
    case Op::kExecSignal:
      return "exec-signal";
    case Op::kTerminal:
      return "terminal";
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
    case Op::kSnapshotSandbox:
      return "snapshot";
    case Op::kForkSandbox:
      return "fork";
    case Op::kListSnapshots:
      return "list-snapshots";
    case Op::kGetSnapshot:
      return "get-snapshot";
    case Op::kDeleteSnapshot:
      return "delete-snapshot";
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
    case Op::kRunCode:
      return "run-code";
  }
  return "?";
}

}  // namespace dsec::launcher
