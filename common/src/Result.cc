#include "dsec/common/Result.h"

#include <cstring>

namespace dsec {

const char* errorCodeName(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument:
      return "invalid argument";
    case ErrorCode::kUnauthenticated:
      return "unauthenticated";
    case ErrorCode::kNotFound:
      return "not found";
    case ErrorCode::kAlreadyExists:
      return "already exists";
    case ErrorCode::kConflict:
      return "conflict";
    case ErrorCode::kResourceExhausted:
      return "resource exhausted";
    case ErrorCode::kTimeout:
      return "timeout";
    case ErrorCode::kUnsupported:
      return "unsupported";
    case ErrorCode::kUnavailable:
      return "unavailable";
    case ErrorCode::kSystem:
      return "system error";
    case ErrorCode::kInternal:
      return "internal error";
  }
  return "unknown error";
}

Error Error::sys(int err, const std::string& context) {
  char buf[256];
  // GNU strerror_r returns the message pointer (which may or may not be buf).
  const char* text = strerror_r(err, buf, sizeof(buf));
  ErrorCode code = ErrorCode::kSystem;
  if (err == ENOENT) code = ErrorCode::kNotFound;
  if (err == EEXIST) code = ErrorCode::kAlreadyExists;
  if (err == ENOSPC || err == EAGAIN || err == ENOMEM || err == EMFILE || err == ENFILE) {
    code = ErrorCode::kResourceExhausted;
  }
  if (err == ENOSYS || err == EOPNOTSUPP) code = ErrorCode::kUnsupported;
  return Error(code, context + ": " + text, err);
}

}  // namespace dsec
