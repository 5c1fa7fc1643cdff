// The fleet's wiring over the shared HTTP client (api/HttpClient.h): forwarding a client's request to a node,
// and the registrar a node runs to (re-)register with the gateway.
#include <unistd.h>

#include <boost/asio/error.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <limits>
#include <optional>

#include "dsec/backends/BackendKind.h"
#include "dsec/common/Logging.h"
#include "dsec/common/Strings.h"
#include "dsec/launcher/fleet/Fleet.h"

namespace dsec::launcher::fleet {
namespace {

namespace net = boost::asio;
using nlohmann::json;
constexpr const char* kLog = "fleet";
constexpr size_t kHeldBackLimit = size_t{1} << 20;

}  // namespace

Status forward(HttpExchange& ex, const std::string& endpoint, const std::string& token,
               const client::CallOptions& options, const std::string* pre_read_body, int hold_back_status,
               std::optional<client::HttpReply>* held_back) {
  DSEC_ASSIGN_OR_RETURN(auto fd, client::connectTo(endpoint, options));
  DSEC_ASSIGN_OR_RETURN(auto ep, parseEndpoint(endpoint));
  SocketStream stream(fd.get(), options.abort_fd, options.io_timeout_ms);
  boost::system::error_code ec;

  // The request: the client's method, target and content type; the fleet token; the body as it comes.
  http::request<http::empty_body> req{ex.method(), std::string(ex.target()), 11};
  req.set(http::field::host, ep.hostPort());
  if (!token.empty()) req.set(http::field::authorization, "Bearer " + token);
  if (auto it = ex.head().find(http::field::content_type); it != ex.head().end()) {
    req.set(http::field::content_type, it->value());
  }
  req.keep_alive(false);
  bool stream_body = pre_read_body == nullptr && ex.hasBody();
  bool chunked_up = false;
  if (pre_read_body) {
    req.content_length(pre_read_body->size());
  } else if (stream_body) {
    if (auto cl = ex.contentLength()) {
      req.content_length(*cl);
    } else {
      req.chunked(true);
      chunked_up = true;
    }
  }
  http::request_serializer<http::empty_body> sr{req};
  http::write_header(stream, sr, ec);
  if (ec) return client::transportError(endpoint, "sending to", ec);
  bool upstream_write_failed = false;
  if (pre_read_body && !pre_read_body->empty()) {
    net::write(stream, net::buffer(*pre_read_body), ec);
    if (ec) upstream_write_failed = true;
  } else if (stream_body) {
    auto st = ex.readBodyStream([&](const char* data, size_t size) -> Status {
      if (upstream_write_failed) return okStatus();  // keep reading the client's body; the node answers anyway
      if (chunked_up) {
        net::write(stream, http::make_chunk(net::const_buffer(data, size)), ec);
      } else {
        net::write(stream, net::const_buffer(data, size), ec);
      }
      if (ec) upstream_write_failed = true;
      return okStatus();
    });
    if (!st.ok()) {
      // The client went away mid-upload: nothing to answer.
      ex.forceClose();
      return okStatus();
    }
    if (chunked_up && !upstream_write_failed) {
      net::write(stream, http::make_chunk_last(), ec);
      if (ec) upstream_write_failed = true;
    }
  }

  // The answer: head first (so a node error keeps its status), then the body piece by piece as it arrives.
  boost::beast::flat_buffer buffer;
  http::response_parser<http::buffer_body> parser;
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());
  http::read_header(stream, buffer, parser, ec);
  if (ec) {
    if (ex.bodyPending()) ex.forceClose();
    return client::transportError(endpoint, upstream_write_failed ? "sending to" : "reading the answer of", ec);
  }
  const auto& head = parser.get().base();
  std::string content_type = "application/octet-stream";
  if (auto it = head.find(http::field::content_type); it != head.end()) content_type = std::string(it->value());
  std::optional<uint64_t> length;
  if (!parser.chunked()) {
    if (auto cl = parser.content_length()) length = *cl;
  }
  if (parser.is_done()) length = 0;
  if (held_back != nullptr && static_cast<int>(head.result_int()) == hold_back_status) {
    // An answer the caller may try elsewhere (a 429): kept, small, and not relayed.
    client::HttpReply reply;
    reply.status = hold_back_status;
    reply.headers = client::relayedHeaders(head);
    reply.headers.emplace_back("Content-Type", content_type);
    bool too_large = false;
    ec = client::readBodyPieces(stream, buffer, parser, [&](const char* data, size_t n) {
      reply.body.append(data, n);
      too_large = reply.body.size() > kHeldBackLimit;
      return !too_large;
    });
    if (ec) return client::transportError(endpoint, "reading the answer of", ec);
    if (too_large) return Error(ErrorCode::kUnavailable, "the answer of " + endpoint + " is too large for a refusal");
    *held_back = std::move(reply);
    return okStatus();
  }
  if (!ex.beginStream(static_cast<int>(head.result_int()), content_type, length, client::relayedHeaders(head)))
    return okStatus();
  bool client_gone = false;
  ec = client::readBodyPieces(stream, buffer, parser, [&](const char* data, size_t n) {
    client_gone = !ex.writeStream(data, n);
    return !client_gone;
  });
  if (client_gone) return okStatus();
  if (ec) {
    DSEC_LOG(kWarn, kLog) << "forwarding from " << endpoint << " ended early: " << ec.message();
    ex.forceClose();  // the client sees a truncated transfer, not a short success
    return okStatus();
  }
  ex.endStream();
  return okStatus();
}

// ---- NodeRegistrar -------------------------------------------------------------------------------------

NodeRegistrar::NodeRegistrar(RegistrarOptions options)
    : options_(std::move(options)), warned_(new std::atomic<bool>[options_.gateways.size()]) {
  for (size_t i = 0; i < options_.gateways.size(); ++i) warned_[i] = false;
}

NodeRegistrar::~NodeRegistrar() { stop(); }

void NodeRegistrar::start() {
  std::lock_guard lock(mu_);
  if (!threads_.empty() || stopping_) return;
  for (size_t i = 0; i < options_.gateways.size(); ++i) threads_.emplace_back([this, i] { loop(i); });
}

void NodeRegistrar::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
}

json NodeRegistrar::registration(bool draining) {
  json backends = json::array({dsec::backends::backendKindName(dsec::backends::BackendKind::kContainer)});
  json admission = nullptr;
  json sandboxes = nullptr;
  client::CallOptions o;
  o.connect_timeout_ms = 1000;
  o.io_timeout_ms = 2000;
  if (auto r = client::call(options_.endpoint, http::verb::get, "/v1/node", options_.token, "", o);
      r.ok() && r->status == 200) {
    auto info = r->json();
    if (info.is_object()) {
      if (info.contains("backends")) backends = info["backends"];
      // What the node admits by, as its own admission computes it: the gateway places with it (no ratio of its
      // own), so both say yes or no alike.
      if (info.contains("admission")) admission = info["admission"];
      if (info.contains("sandboxes")) sandboxes = info["sandboxes"];
    }
  }
  return json{{"name", options_.name},
              {"endpoint", options_.endpoint},
              {"capacity", {{"cpus", options_.cpus}, {"memory_bytes", options_.memory_bytes}}},
              {"backends", backends},
              {"draining", draining},
              {"admission", admission},
              {"sandboxes", sandboxes}};
}

Status NodeRegistrar::registerWith(size_t gateway) {
  bool draining;
  {
    std::lock_guard lock(mu_);
    draining = draining_;
  }
  const std::string& endpoint = options_.gateways[gateway];
  client::CallOptions o;
  o.connect_timeout_ms = 1000;
  o.io_timeout_ms = 3000;
  DSEC_ASSIGN_OR_RETURN(auto reply, client::call(endpoint, http::verb::post, "/v1/fleet/nodes", options_.token,
                                                 registration(draining).dump(), o));
  if (reply.status != 200 && reply.status != 201) {
    return Error(ErrorCode::kUnavailable, "gateway " + endpoint + " refused the registration (" +
                                              std::to_string(reply.status) + "): " + reply.body);
  }
  auto answer = reply.json();
  if (answer.is_object() && answer.value("state", "") == "draining") drain_requested_.store(true);
  return okStatus();
}

Status NodeRegistrar::registerOnce() {
  Status last = Error(ErrorCode::kUnavailable, "no gateway to register with");
  bool any = false;
  for (size_t i = 0; i < options_.gateways.size(); ++i) {
    auto st = registerWith(i);
    any = any || st.ok();
    if (!st.ok()) last = st;
  }
  return any ? okStatus() : last;
}

void NodeRegistrar::loop(size_t gateway) {
  for (;;) {
    auto st = registerWith(gateway);
    if (!st.ok()) {
      // Expected while a gateway restarts, and for good once its node died: said once per outage.
      if (!warned_[gateway].exchange(true))
        DSEC_LOG(kWarn, kLog) << "registering " << options_.name << ": " << st.error().message();
    } else if (warned_[gateway].exchange(false)) {
      DSEC_LOG(kInfo, kLog) << "node " << options_.name << " registered with " << options_.gateways[gateway]
                            << " again";
    }
    std::unique_lock lock(mu_);
    if (cv_.wait_for(lock, std::chrono::duration<double>(options_.interval_seconds), [this] { return stopping_; })) {
      return;
    }
  }
}

int64_t NodeRegistrar::ownSandboxCount() {
  client::CallOptions o;
  o.connect_timeout_ms = 1000;
  o.io_timeout_ms = 2000;
  auto r = client::call(options_.endpoint, http::verb::get, "/v1/node", options_.token, "", o);
  if (!r.ok() || r->status != 200) return -1;
  auto info = r->json();
  return info.is_object() ? info.value("sandboxes", int64_t{-1}) : -1;
}

int64_t NodeRegistrar::drain(double timeout_seconds) {
  {
    std::lock_guard lock(mu_);
    draining_ = true;
  }
  (void)registerOnce();  // tells the gateways at once
  double end = monotonicSeconds() + timeout_seconds;
  int64_t left = ownSandboxCount();
  while (left != 0 && monotonicSeconds() < end) {
    ::usleep(200 * 1000);
    left = ownSandboxCount();
  }
  return left;
}

void NodeRegistrar::deregister() {
  stop();
  client::CallOptions o;
  o.connect_timeout_ms = 1000;
  o.io_timeout_ms = 2000;
  for (const auto& gateway : options_.gateways) {
    (void)client::call(gateway, http::verb::delete_, "/v1/fleet/nodes/" + options_.name, options_.token, "", o);
  }
}

}  // namespace dsec::launcher::fleet
