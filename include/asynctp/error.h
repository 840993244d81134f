// asynctp::Error: the one exception type the library throws.
//
// Every message names what was wrong and what was expected or what to do about it, and starts with the
// rank that raised it where a rank is known ("rank 1: ..."), so that a failure in a job of many
// processes can be traced to its source.
#pragma once

#include <stdexcept>
#include <string>

namespace asynctp {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace asynctp
