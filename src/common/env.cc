#include "common/env.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <string>

#include "common/check.h"

namespace asynctp::detail {
namespace {

enum class Kind { kInt, kFlag, kWord, kText };

struct KnobInfo {
  const char* variable;
  Kind kind;
  const char* words;
};

constexpr KnobInfo kKnobs[] = {
#define ASYNCTP_KNOB_INFO(id, variable, kind, words, use) {variable, Kind::kind, words},
    ASYNCTP_KNOBS(ASYNCTP_KNOB_INFO)
#undef ASYNCTP_KNOB_INFO
};

const KnobInfo& info(Knob knob, Kind kind) {
  const KnobInfo& k = kKnobs[static_cast<int>(knob)];
  ASYNCTP_CHECK(k.kind == kind, "internal: ", k.variable, " is read as another kind than it is declared");
  return k;
}

// The value, or null where the variable is unset or empty.
const char* value_of(const KnobInfo& k) {
  const char* text = std::getenv(k.variable);
  return text == nullptr || *text == '\0' ? nullptr : text;
}

}  // namespace

const char* knob_name(Knob knob) { return kKnobs[static_cast<int>(knob)].variable; }

int knob_int(Knob knob, int fallback) {
  const KnobInfo& k = info(knob, Kind::kInt);
  const char* text = value_of(k);
  if (text == nullptr) return fallback;
  errno = 0;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  ASYNCTP_CHECK(errno == 0 && end != text && *end == '\0' && value > 0 && value <= INT_MAX,
                "environment variable ", k.variable, "='", text, "' is not a positive integer (expected, e.g., ",
                k.variable, "=", fallback > 0 ? fallback : 1, ")");
  return static_cast<int>(value);
}

bool knob_flag(Knob knob) {
  const KnobInfo& k = info(knob, Kind::kFlag);
  const char* text = value_of(k);
  if (text == nullptr || std::string(text) == "0") return false;
  ASYNCTP_CHECK(std::string(text) == "1", "environment variable ", k.variable, "='", text,
                "' is not 0 or 1 (expected ", k.variable, "=1 to turn it on)");
  return true;
}

int knob_word(Knob knob) {
  const KnobInfo& k = info(knob, Kind::kWord);
  const char* text = value_of(k);
  if (text == nullptr) return -1;
  const std::string words = k.words;
  std::string expected;
  int index = 0;
  for (size_t start = 0; start <= words.size(); ++index) {
    const size_t bar = std::min(words.find('|', start), words.size());
    const std::string word = words.substr(start, bar - start);
    if (word == text) return index;
    expected += detail::cat(expected.empty() ? "" : " or ", word);
    start = bar + 1;
  }
  raise(detail::cat("environment variable ", k.variable, "='", text, "' is not one of its values (expected ",
                    expected, ")"));
}

std::string knob_text(Knob knob) {
  const char* text = value_of(info(knob, Kind::kText));
  return text == nullptr ? std::string() : std::string(text);
}

bool one_device_connection() {
  static const bool one = [] {
    const char* v = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
    return v != nullptr && std::strtol(v, nullptr, 10) == 1;
  }();
  return one;
}

int resolve_timeout_ms(int requested) {
  return requested > 0 ? requested : knob_int(Knob::kTimeoutMs, kDefaultTimeoutMs);
}

}  // namespace asynctp::detail
