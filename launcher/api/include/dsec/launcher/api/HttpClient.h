// The one C++ HTTP/1.1 client of dsec: the gateway talking to nodes, a node registering with its gateway, and
// the `dsec` CLI talking to a fleet. Blocking, on non-blocking sockets with poll(): every connect and every
// read or write has a timeout and an abort fd, so a peer that stops answering can never pin a thread.
// Keep-alive connections come from a ConnectionPool when one is given.
#pragma once

#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "dsec/common/Endpoint.h"
#include "dsec/common/Fd.h"
#include "dsec/common/Result.h"
#include "dsec/launcher/api/ConnectionPool.h"
#include "dsec/launcher/api/HttpServer.h"

namespace dsec::launcher::client {

struct CallOptions {
  int connect_timeout_ms = 2000;
  int io_timeout_ms = 10000;  // per read/write inactivity; -1: none (a CLI waiting for a long exec)
  int abort_fd = -1;          // readable -> the call fails at once (the node was declared lost)
  // Take a keep-alive connection from here and give it back after a complete answer (null: one connection
  // per call, closed after it).
  ConnectionPool* pool = nullptr;
  uint64_t max_body_bytes = 64ULL << 20;  // of a whole answer (call())
  std::string user_agent;                 // sent when not empty
  // More request headers; one named like a default (Content-Type) replaces it.
  std::vector<std::pair<std::string, std::string>> headers;
  // The reply keeps every header of the answer, not only those a client relays.
  bool all_headers = false;
};

struct HttpReply {
  int status = 0;
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // Retry-After, Allow, Content-Type (or all)
  bool closed = false;                                       // the answer ended its connection (Connection: close)
  // The body as JSON, or a null json if it is not JSON.
  nlohmann::json json() const;
};

// Connects to endpoint (non-blocking connect with a timeout).
Result<UniqueFd> connectTo(const std::string& endpoint, const CallOptions& options);

// One request with a whole body and a whole reply (JSON routes). Transport failures are kUnavailable errors
// whose message says what happened (refused, timed out, closed); an HTTP error status is a reply, not an error.
// A pooled connection the peer closed meanwhile is retried once on a new one (nothing is sent twice).
Result<HttpReply> call(const std::string& endpoint, boost::beast::http::verb method, const std::string& target,
                       const std::string& token, const std::string& body, const CallOptions& options);

// As call(), but a 2xx answer's body goes to on_body piece by piece as it arrives (NDJSON streams) instead of
// into the reply; another status keeps its (error) body in the reply. on_body returning false ends the call.
Result<HttpReply> callStreaming(const std::string& endpoint, boost::beast::http::verb method, const std::string& target,
                                const std::string& token, const std::string& body, const CallOptions& options,
                                const std::function<bool(const char*, size_t)>& on_body);

// As call(), but the request body, body_size bytes, comes from next_piece piece by piece (each call is given
// the bytes produced so far; an empty piece ends the body early), so a large upload is never held whole. It
// always goes on a new connection. A server that answers before the whole body (401, 413) and closes is still
// heard: its answer is read after a failed send.
Result<HttpReply> callUpload(const std::string& endpoint, boost::beast::http::verb method, const std::string& target,
                             const std::string& token, uint64_t body_size,
                             const std::function<std::string(uint64_t produced)>& next_piece,
                             const CallOptions& options);

// Reads the rest of an answer's body in pieces as they arrive, handing each non-empty one to `on_piece`. Stops
// at the end (no error), on a transport error (returned), or when on_piece returns false (no error).
boost::system::error_code readBodyPieces(SocketStream& stream, boost::beast::flat_buffer& buffer,
                                         boost::beast::http::response_parser<boost::beast::http::buffer_body>& parser,
                                         const std::function<bool(const char*, size_t)>& on_piece);

// A kUnavailable error for a transport failure ("reading the answer of http://...: timed out").
Error transportError(const std::string& endpoint, const std::string& what, const boost::system::error_code& ec);
// The headers a client needs from an answer to pass it on: Retry-After and Allow.
std::vector<std::pair<std::string, std::string>> relayedHeaders(const boost::beast::http::response_header<>& h);

}  // namespace dsec::launcher::client
