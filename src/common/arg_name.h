// An argument's name in an error message ("a_shard", "bs[2]"), kept as its parts: a call builds the
// names of all its arguments, and only a refusal prints one.
#pragma once

#include <ostream>

namespace asynctp::detail {

struct ArgName {
  ArgName(const char* base) : base(base) {}  // NOLINT(google-explicit-constructor): "a_shard" is a name
  ArgName(const char* base, long long index) : base(base), index(index) {}

  const char* base;
  long long index = -1;  // -1: no index
};

inline std::ostream& operator<<(std::ostream& os, const ArgName& name) {
  os << name.base;
  if (name.index >= 0) os << '[' << name.index << ']';
  return os;
}

}  // namespace asynctp::detail
