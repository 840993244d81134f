// Internal: one flat JSON object per line (JSON Lines), the tuning cache's format. Values are strings,
// numbers, booleans or null; nesting is refused, since the cache never needs it.
#pragma once

#include <map>
#include <string>

namespace asynctp::tune {

struct JsonValue {
  enum class Kind { kNull, kBool, kNumber, kString } kind = Kind::kNull;
  bool boolean = false;
  double number = 0;
  std::string text;
};

using FlatObject = std::map<std::string, JsonValue>;

// Parses `line` (one object). Returns false and sets `error` (what and at which column) where the line
// is not a flat JSON object.
bool parse_flat_object(const std::string& line, FlatObject& out, std::string& error);

}  // namespace asynctp::tune
