// The resolved config as YAML (config.resolved.yaml, `keel validate --print-config`): every key
// written, in the schema's order, with values that load back to an equal Config (load.h).
#include <charconv>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "config/fields.h"
#include "config/load.h"

namespace keel::config {
namespace {

// ---- Writer
// --------------------------------------------------------------------------------------

std::string yaml_scalar(const std::string& s) {
  // Always double-quoted: no string can then be mistaken for a number, bool or null on reading
  // back.
  std::string out = "\"";
  for (const unsigned char ch : s) {
    switch (ch) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (ch < 0x20 || ch == 0x7f) {
          static const char* kHex = "0123456789abcdef";
          out += "\\x";
          out += kHex[ch >> 4];
          out += kHex[ch & 0xf];
        } else {
          out += static_cast<char>(ch);
        }
    }
  }
  return out + "\"";
}

std::string yaml_scalar(bool b) { return b ? "true" : "false"; }

std::string yaml_scalar(int64_t i) { return std::to_string(i); }
// Quoted like any string, so that YAML 1.1 readers do not take `off` for a bool.
template <Choice E>
std::string yaml_scalar(E e) {
  return yaml_scalar(std::string(name_of(e)));
}

// Shortest text that parses back to the same double (std::to_chars), so the round trip is exact,
// then made to look like a float to every YAML reader: YAML 1.1 readers (PyYAML) take "3e-04" for a
// string and "1" for an int, so write "3.0e-4" and "1.0".
std::string yaml_scalar(double d) {
  if (std::isnan(d)) return ".nan";
  if (std::isinf(d)) return d > 0 ? ".inf" : "-.inf";
  char buffer[64];
  const auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, d);
  std::string text(buffer, end);
  const size_t exponent = text.find('e');
  std::string mantissa = text.substr(0, exponent);
  if (mantissa.find('.') == std::string::npos) mantissa += ".0";
  if (exponent == std::string::npos) return mantissa;
  std::string digits = text.substr(exponent + 2);  // to_chars writes a sign: e+20, e-04
  digits.erase(0, std::min(digits.find_first_not_of('0'), digits.size() - 1));
  return mantissa + "e" + text[exponent + 1] + digits;
}

template <class T>
std::string yaml_scalar(const std::vector<T>& items) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + yaml_scalar(items[i]);
  return out + "]";
}

// Block style for sections and lists of structs, flow style for lists of scalars.
class Writer {
 public:
  Writer(std::string& out, int indent) : out_(out), indent_(indent) {}

  template <class T>
  void field(const char* key, T& value) {
    out_ += pad() + key + ": " + yaml_scalar(value) + "\n";
  }
  void field(const char* key, int64_t& value, AutoAllowed) {
    out_ += pad() + key + ": " + (value == kAuto ? std::string("auto") : yaml_scalar(value)) + "\n";
  }
  template <class S>
  void section(const char* key, S& sub) {
    out_ += pad() + key + ":\n";
    Writer nested(out_, indent_ + 2);
    visit(nested, sub);
  }
  template <class S>
  void list(const char* key, std::vector<S>& items) {
    if (items.empty()) {
      out_ += pad() + key + ": []\n";
      return;
    }
    out_ += pad() + key + ":\n";
    for (auto& item : items) {
      std::string body;
      Writer nested(body, indent_ + 4);
      visit(nested, item);
      body.replace(indent_ + 2, 2, "- ");  // the item's first key shares the line with its dash
      out_ += body;
    }
  }

 private:
  std::string pad() const { return std::string(indent_, ' '); }
  std::string& out_;
  int indent_;
};

}  // namespace

std::string to_yaml(const Config& config) {
  Config copy = config;  // visit() takes mutable references; the writer only reads
  std::string out;
  Writer writer(out, 0);
  visit(writer, copy);
  return out;
}

}  // namespace keel::config
