#include "cli/parse.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>

namespace asynctp::tools {

std::optional<int64_t> integer_in(const std::string& text, int64_t lo, int64_t hi) {
  const size_t first_digit = !text.empty() && text[0] == '-' ? 1 : 0;
  if (first_digit >= text.size()) return std::nullopt;
  for (size_t i = first_digit; i < text.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(text[i]))) return std::nullopt;
  }
  errno = 0;
  const long long v = std::strtoll(text.c_str(), nullptr, 10);
  if (errno == ERANGE || v < lo || v > hi) return std::nullopt;
  return static_cast<int64_t>(v);
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> items;
  for (size_t at = 0;;) {
    const size_t next = text.find(sep, at);
    items.push_back(text.substr(at, next == std::string::npos ? std::string::npos : next - at));
    if (next == std::string::npos) return items;
    at = next + 1;
  }
}

}  // namespace asynctp::tools
