#include "dsec/common/Prometheus.h"

namespace dsec::prometheus {
namespace {

std::string escape(std::string_view text, bool quote) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (quote && c == '"') {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

std::string escapeLabelValue(std::string_view value) { return escape(value, true); }

std::string escapeHelp(std::string_view help) { return escape(help, false); }

void family(std::string* out, std::string_view name, std::string_view type, std::string_view help) {
  if (!help.empty()) {
    *out += "# HELP ";
    *out += name;
    *out += ' ';
    *out += escapeHelp(help);
    *out += '\n';
  }
  *out += "# TYPE ";
  *out += name;
  *out += ' ';
  *out += type;
  *out += '\n';
}

void sample(std::string* out, std::string_view name, const Labels& labels, std::string_view value) {
  *out += name;
  if (!labels.empty()) {
    *out += '{';
    bool first = true;
    for (const auto& [key, v] : labels) {
      if (!first) *out += ',';
      first = false;
      *out += key;
      *out += "=\"";
      *out += escapeLabelValue(v);
      *out += '"';
    }
    *out += '}';
  }
  *out += ' ';
  *out += value;
  *out += '\n';
}

void counter(std::string* out, std::string_view name, std::string_view help, std::string_view value) {
  family(out, name, "counter", help);
  sample(out, name, value);
}

void gauge(std::string* out, std::string_view name, std::string_view help, std::string_view value) {
  family(out, name, "gauge", help);
  sample(out, name, value);
}

}  // namespace dsec::prometheus
