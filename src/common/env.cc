#include "common/env.h"

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <string>

#include "common/check.h"

namespace asynctp::detail {

int env_positive_int(const char* name, int fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  errno = 0;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  ASYNCTP_CHECK(errno == 0 && end != text && *end == '\0' && value > 0 && value <= INT_MAX,
                "environment variable ", name, "='", text, "' is not a positive integer (expected, e.g., ",
                name, "=", fallback, ")");
  return static_cast<int>(value);
}

bool env_flag(const char* name) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0' || std::string(text) == "0") return false;
  ASYNCTP_CHECK(std::string(text) == "1", "environment variable ", name, "='", text, "' is not 0 or 1 (expected ",
                name, "=1 to turn it on)");
  return true;
}

int resolve_timeout_ms(int requested) {
  return requested > 0 ? requested : env_positive_int("ASYNCTP_TIMEOUT_MS", kDefaultTimeoutMs);
}

}  // namespace asynctp::detail
