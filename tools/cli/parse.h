// Numbers and lists on the tools' command lines, parsed one way for every tool. Each tool words its
// own errors (naming the flag and what it takes); these only say whether the text is valid.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace asynctp::tools {

// `text` as a base-10 integer from `lo` to `hi`: an optional '-', then digits and nothing else (no
// spaces, no '+', no suffix). A value past int64's range is out of range, never wrapped or cut short.
// Empty where the text is not such an integer.
std::optional<int64_t> integer_in(const std::string& text, int64_t lo, int64_t hi);

// `text` split at every `sep`. Empty items stay, for the caller to refuse by name: "" is one empty
// item, "a," is "a" and "".
std::vector<std::string> split(const std::string& text, char sep);

}  // namespace asynctp::tools
