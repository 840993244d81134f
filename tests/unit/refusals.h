// What the CPU tests of argument checks share: the message an asynctp::Error carries, and a check
// that a call is refused with a message naming what it should.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "asynctp/error.h"

namespace asynctp::testing {

// The message of the asynctp::Error `fn` throws, or "<no error>".
inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace asynctp::testing

#define EXPECT_REFUSED(call, text)                                                     \
  do {                                                                                 \
    const std::string m_ = ::asynctp::testing::error_of([&] { (void)(call); });        \
    EXPECT_NE(m_.find(text), std::string::npos) << "message: " << m_;                  \
  } while (0)
