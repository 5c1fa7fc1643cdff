// Maps (method, target) to an API operation. Pure logic: unknown paths are 404, known paths with the wrong
// method 405 (with the allowed methods), malformed query strings and invalid session names 400.
// RouteTable is the one routing mechanism of the HTTP edge: the node API (matchRoute) and the fleet gateway
// each declare their table of routes with it.
#pragma once

#include <boost/beast/http/verb.hpp>
#include <initializer_list>
#include <map>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "dsec/common/Result.h"

namespace dsec::launcher {

enum class Op {
  kHealthz,
  kMetrics,
  kNodeInfo,
  kListLayers,
  kListSandboxes,
  kCreateSandbox,
  kGetSandbox,
  kDestroySandbox,
  kPause,
  kResume,
  kSetNetwork,  // PUT /v1/sandboxes/{id}/network
  kSetProtect,  // PUT /v1/sandboxes/{id}/protect
  kSetTimeout,  // PUT /v1/sandboxes/{id}/timeout
  kViolations,  // GET /v1/sandboxes/{id}/violations
  kExec,
  kExecStream,
  kExecStdin,   // POST /v1/sandboxes/{id}/exec/{exec}/stdin
  kExecSignal,  // POST /v1/sandboxes/{id}/exec/{exec}/signal
  kTerminal,    // GET /v1/sandboxes/{id}/terminal (WebSocket)
  kReadFile,
  kWriteFile,
  kRemoveFile,
  kListDir,
  kStatFile,
  kGetTar,
  kPutTar,
  kListSessions,
  kPutSession,
  kGetSession,
  kDeleteSession,
  kAttachSession,
  kCall,             // POST /v1/call (fncall)
  kRunCode,          // POST /run_code (SandboxFusion-compatible)
  kSnapshotSandbox,  // POST /v1/sandboxes/{id}/snapshot
  kForkSandbox,      // POST /v1/sandboxes/{id}/fork
  kListSnapshots,    // GET /v1/snapshots
  kGetSnapshot,      // GET /v1/snapshots/{name}
  kDeleteSnapshot,   // DELETE /v1/snapshots/{name}
};

struct QueryParams {
  std::multimap<std::string, std::string> values;
  // The last value of a key, or fallback.
  std::string get(const std::string& key, const std::string& fallback = "") const;
  bool has(const std::string& key) const { return values.count(key) > 0; }
  std::vector<std::string> all(const std::string& key) const;
};

struct RouteMatch {
  int error_status = 0;  // 0 when matched; else 400/404/405
  std::string error;     // message for the error
  std::string allow;     // for 405: "GET, POST"
  Op op = Op::kHealthz;
  std::string sandbox_id;
  std::string sub_id;    // a route's second "*" after the sandbox's (the exec of /exec/{exec}/stdin), raw
  std::string session;   // session routes: the (valid) session name
  std::string snapshot;  // snapshot routes: the name, percent-decoded (checked by the store)
  QueryParams query;
};

// A table of routes. A pattern is a path of segments: "*" matches one segment, a final "**" one or more. The
// first pattern that matches the path decides; a method it lacks is 405 with its methods in `allow`.
struct TableMatch {
  int error_status = 0;  // 0 when matched; else 400 (query) / 404 (no route) / 405 (method)
  std::string error;
  std::string allow;                   // for 405: "GET, POST"
  int route = -1;                      // the route's id; also set for a 405 (the path matched)
  std::vector<std::string> wildcards;  // the raw segments "*" and "**" matched, in order ("**": joined by '/')
  std::string path;                    // the target's path, without a trailing '/'
  QueryParams query;
};

class RouteTable {
 public:
  struct Method {
    boost::beast::http::verb verb;
    int route;
  };
  RouteTable& add(std::string_view pattern, std::initializer_list<Method> methods);
  // A route that takes every method (the gateway's forwarding).
  RouteTable& addAnyMethod(std::string_view pattern, int route);
  TableMatch match(boost::beast::http::verb method, std::string_view target) const;

 private:
  struct Entry {
    std::vector<std::string> segments;
    std::vector<Method> methods;
    int any_method_route = -1;
  };
  std::vector<Entry> entries_;
};

RouteMatch matchRoute(boost::beast::http::verb method, std::string_view target);
// 1-128 of [A-Za-z0-9._-], not "." or "..": what a route takes as a sandbox id.
bool validSandboxId(std::string_view id);
// The parameters of a query string ("a=1&b=x%20y"), each key and value percent-decoded once; kInvalidArgument for
// a malformed escape. queryOf takes a whole request target and parses what follows its '?'.
Result<QueryParams> parseQuery(std::string_view query);
Result<QueryParams> queryOf(std::string_view target);
// Percent-decoding of a query component ('+' is a space); false on a malformed escape.
bool percentDecode(std::string_view in, std::string* out);
// How a route's request body is read.
enum class BodyKind { kNone, kJson, kStream };
BodyKind bodyKind(Op op);
const char* opName(Op op);

}  // namespace dsec::launcher
