// The Prometheus text exposition format (version 0.0.4), written by hand in one place: HELP and TYPE lines,
// samples with escaped label values, numbers. Pure text formatting, used by the node core, the node API and
// the fleet gateway alike.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace dsec::prometheus {

// The Content-Type of a /metrics answer.
inline constexpr const char* kContentType = "text/plain; version=0.0.4";

// A label value with backslash, double quote and newline escaped (\\, \", \n).
std::string escapeLabelValue(std::string_view value);
// A HELP text with backslash and newline escaped.
std::string escapeHelp(std::string_view help);

// Integers as they are; floating point as %.6g.
template <typename T>
requires std::is_arithmetic_v<T> std::string number(T value) {
  if constexpr (std::is_same_v<T, bool>) {
    return value ? "1" : "0";
  } else if constexpr (std::is_integral_v<T>) {
    return std::to_string(value);
  } else {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.6g", static_cast<double>(value));
    return buf;
  }
}

using Labels = std::vector<std::pair<std::string, std::string>>;

// "# HELP name help" (when help is not empty) and "# TYPE name type".
void family(std::string* out, std::string_view name, std::string_view type, std::string_view help = {});
// "name{k="v",...} value" (no braces without labels).
void sample(std::string* out, std::string_view name, const Labels& labels, std::string_view value);
inline void sample(std::string* out, std::string_view name, std::string_view value) { sample(out, name, {}, value); }

// A whole family of one unlabelled sample.
void counter(std::string* out, std::string_view name, std::string_view help, std::string_view value);
void gauge(std::string* out, std::string_view name, std::string_view help, std::string_view value);
template <typename T>
requires std::is_arithmetic_v<T>
void counter(std::string* out, std::string_view name, std::string_view help, T value) {
  counter(out, name, help, number(value));
}
template <typename T>
requires std::is_arithmetic_v<T>
void gauge(std::string* out, std::string_view name, std::string_view help, T value) {
  gauge(out, name, help, number(value));
}

}  // namespace dsec::prometheus
