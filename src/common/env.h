// Internal: settings read from the environment.
#pragma once

namespace asynctp::detail {

constexpr int kDefaultTimeoutMs = 30000;
constexpr int kDefaultLaunchTimeoutMs = 600000;

// The integer value of environment variable `name`, or `fallback` where it is unset. A value that is
// not a positive integer throws asynctp::Error naming the variable.
int env_positive_int(const char* name, int fallback);

// Environment variable `name` as an on/off switch: unset, empty or "0" is off, "1" is on; anything
// else throws asynctp::Error naming the variable.
bool env_flag(const char* name);

// `requested` if > 0, else ASYNCTP_TIMEOUT_MS, else kDefaultTimeoutMs.
int resolve_timeout_ms(int requested);

}  // namespace asynctp::detail
