#include "tune/flat_json.h"

#include <cctype>
#include <cmath>
#include <cstdlib>

namespace asynctp::tune {
namespace {

class Parser {
 public:
  Parser(const std::string& s, std::string& error) : s_(s), error_(error) {}

  bool object(FlatObject& out) {
    skip();
    if (!eat('{')) return fail("expected '{'");
    skip();
    if (eat('}')) return end();
    for (;;) {
      std::string key;
      skip();
      if (!string(key)) return false;
      skip();
      if (!eat(':')) return fail("expected ':' after a key");
      skip();
      JsonValue v;
      if (!value(v)) return false;
      out[key] = std::move(v);
      skip();
      if (eat('}')) return end();
      if (!eat(',')) return fail("expected ',' or '}'");
    }
  }

 private:
  bool end() {
    skip();
    return i_ == s_.size() || fail("text after the object");
  }

  bool value(JsonValue& v) {
    if (i_ < s_.size() && s_[i_] == '"') {
      v.kind = JsonValue::Kind::kString;
      return string(v.text);
    }
    if (word("true")) return v.kind = JsonValue::Kind::kBool, v.boolean = true, true;
    if (word("false")) return v.kind = JsonValue::Kind::kBool, v.boolean = false, true;
    if (word("null")) return v.kind = JsonValue::Kind::kNull, true;
    if (i_ < s_.size() && (s_[i_] == '{' || s_[i_] == '[')) return fail("nested objects and arrays are not used here");
    return number(v);
  }

  // A number as JSON writes it: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?, and finite. strtod
  // alone would also take nan, inf, hex and 1e400 (as infinity).
  bool number(JsonValue& v) {
    const size_t begin = i_;
    eat('-');
    if (eat('0')) {
      if (digits() > 0) return fail("a number with a leading zero");
    } else if (digits() == 0) {
      return fail("expected a value");
    }
    if (eat('.') && digits() == 0) return fail("expected a digit after '.'");
    if (eat('e') || eat('E')) {
      if (!eat('+')) eat('-');
      if (digits() == 0) return fail("expected a digit in the exponent");
    }
    v.number = std::strtod(s_.substr(begin, i_ - begin).c_str(), nullptr);
    if (!std::isfinite(v.number)) return fail("number out of range");
    v.kind = JsonValue::Kind::kNumber;
    return true;
  }

  size_t digits() {
    size_t n = 0;
    while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) ++i_, ++n;
    return n;
  }

  bool string(std::string& out) {
    if (!eat('"')) return fail("expected a string");
    while (i_ < s_.size()) {
      const char c = s_[i_++];
      if (c == '"') return true;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i_ >= s_.size()) break;
      const char e = s_[i_++];
      switch (e) {
        case '"': case '\\': case '/': out += e; break;
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'u': {
          long code = 0;
          for (int k = 0; k < 4; ++k, ++i_) {
            if (i_ >= s_.size() || !std::isxdigit(static_cast<unsigned char>(s_[i_]))) {
              return fail("a \\u escape needs four hex digits");
            }
            code = code * 16 + std::stol(std::string(1, s_[i_]), nullptr, 16);
          }
          if (code > 0x7F) return fail("non-ASCII \\u escapes are not used here");
          out += static_cast<char>(code);
          break;
        }
        default: return fail("unknown escape");
      }
    }
    return fail("unterminated string");
  }

  bool word(const char* w) {
    size_t n = 0;
    while (w[n] != '\0') ++n;
    if (s_.compare(i_, n, w) != 0) return false;
    i_ += n;
    return true;
  }
  bool eat(char c) {
    if (i_ < s_.size() && s_[i_] == c) return ++i_, true;
    return false;
  }
  void skip() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  bool fail(const char* what) {
    error_ = std::string(what) + " at column " + std::to_string(i_ + 1);
    return false;
  }

  const std::string& s_;
  std::string& error_;
  size_t i_ = 0;
};

}  // namespace

bool parse_flat_object(const std::string& line, FlatObject& out, std::string& error) {
  out.clear();
  return Parser(line, error).object(out);
}

}  // namespace asynctp::tune
