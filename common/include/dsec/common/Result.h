// Errors are values on every system path: Result<T> holds either a T or an Error (code, errno, message).
#pragma once

#include <cerrno>
#include <string>
#include <utility>
#include <variant>

namespace dsec {

enum class ErrorCode {
  kInvalidArgument,    // the caller sent something malformed or impossible (HTTP 400)
  kUnauthenticated,    // missing or wrong token (401)
  kNotFound,           // no such sandbox, layer, path (404)
  kAlreadyExists,      // e.g. rebuilding an existing NAME:VERSION (409)
  kConflict,           // the object is in the wrong state for the request (409)
  kResourceExhausted,  // the node has no room: capacity (429)
  kTimeout,            // an operation ran out of time (504)
  kUnsupported,        // the host lacks a kernel feature (501)
  kUnavailable,        // try again later (503)
  kSystem,             // a system call failed (500)
  kInternal,           // a bug (500)
};

const char* errorCodeName(ErrorCode code);

class Error {
 public:
  Error(ErrorCode code, std::string message, int sys_errno = 0)
      : code_(code), errno_(sys_errno), message_(std::move(message)) {}

  // A failed system call: message becomes "context: strerror(err)".
  static Error sys(int err, const std::string& context);
  static Error invalid(std::string message) { return {ErrorCode::kInvalidArgument, std::move(message)}; }
  static Error notFound(std::string message) { return {ErrorCode::kNotFound, std::move(message)}; }
  static Error internal(std::string message) { return {ErrorCode::kInternal, std::move(message)}; }

  ErrorCode code() const { return code_; }
  int sysErrno() const { return errno_; }
  const std::string& message() const { return message_; }
  // Prefix the message with more context, keeping code and errno: "creating sandbox x: mount overlay: EPERM".
  Error wrap(const std::string& context) const& { return Error(code_, context + ": " + message_, errno_); }
  std::string toString() const { return std::string(errorCodeName(code_)) + ": " + message_; }

 private:
  ErrorCode code_;
  int errno_;
  std::string message_;
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}      // NOLINT(google-explicit-constructor)
  Result(Error error) : v_(std::move(error)) {}  // NOLINT(google-explicit-constructor)

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  // The value, or nullptr for an error: for code that must not throw (destructors, C callbacks).
  T* ifOk() noexcept { return std::get_if<0>(&v_); }
  const Error& error() const { return std::get<1>(v_); }

 private:
  std::variant<T, Error> v_;
};

template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Error error) : error_(std::move(error)), ok_(false) {}  // NOLINT(google-explicit-constructor)
  bool ok() const { return ok_; }
  explicit operator bool() const { return ok_; }
  const Error& error() const { return error_; }

 private:
  Error error_{ErrorCode::kInternal, ""};
  bool ok_ = true;
};

using Status = Result<void>;
inline Status okStatus() { return {}; }

}  // namespace dsec

// Propagate an error: DSEC_TRY(status_expr);
#define DSEC_TRY(expr)                 \
  do {                                 \
    auto dsec_try_result_ = (expr);    \
    if (!dsec_try_result_.ok()) {      \
      return dsec_try_result_.error(); \
    }                                  \
  } while (0)

#define DSEC_CONCAT_INNER_(a, b) a##b
#define DSEC_CONCAT_(a, b) DSEC_CONCAT_INNER_(a, b)
// DSEC_ASSIGN_OR_RETURN(auto fd, openSomething());
#define DSEC_ASSIGN_OR_RETURN(lhs, expr) DSEC_ASSIGN_OR_RETURN_IMPL_(DSEC_CONCAT_(dsec_r_, __LINE__), lhs, expr)
// `tmp` is a generated name and `lhs` may be a declaration ("auto fd"): neither can be parenthesized.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define DSEC_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) {                                  \
    return tmp.error();                             \
  }                                                 \
  lhs = std::move(tmp).value()
// NOLINTEND(bugprone-macro-parentheses)
