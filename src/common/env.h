// Internal: the library's settings read from the environment, declared in one table.
#pragma once

#include <string>

namespace asynctp::detail {

constexpr int kDefaultTimeoutMs = 30000;
constexpr int kDefaultLaunchTimeoutMs = 600000;

// Every ASYNCTP_* variable the library reads, one line each: X(id, variable, kind, words, use), where
// kind is how the value is read (kInt: a positive integer; kFlag: 0 or 1; kWord: one of `words`,
// '|'-separated; kText: taken as written) and use says whether production code sets it (kUse) or it
// exists to compare variants (kMeasurement). Nothing else in src/ names an ASYNCTP_* variable, and
// docs/reference/environment.md's table is checked against this one (tests/scripts/docs_test.py).
#define ASYNCTP_KNOBS(X)                                                                 \
  X(kTimeoutMs, "ASYNCTP_TIMEOUT_MS", kInt, "", kUse)                                    \
  X(kLaunchTimeoutMs, "ASYNCTP_LAUNCH_TIMEOUT_MS", kInt, "", kUse)                       \
  X(kTuningCache, "ASYNCTP_TUNING_CACHE", kText, "", kUse)                               \
  X(kCheckNan, "ASYNCTP_CHECK_NAN", kFlag, "", kUse)                                     \
  X(kWatchdog, "ASYNCTP_WATCHDOG", kWord, "on|off", kUse)                                \
  X(kTraceTiles, "ASYNCTP_TRACE_TILES", kText, "", kMeasurement)                         \
  X(kPipelinedEager, "ASYNCTP_PIPELINED_EAGER", kFlag, "", kMeasurement)                 \
  X(kPipelinedRsSum, "ASYNCTP_PIPELINED_RS_SUM", kWord, "gemm|kernel", kMeasurement)     \
  X(kFusedRsReduce, "ASYNCTP_FUSED_RS_REDUCE", kWord, "epilogue|fixup", kMeasurement)    \
  X(kFusedRsPush, "ASYNCTP_FUSED_RS_PUSH", kWord, "copy-engine|kernel", kMeasurement)    \
  X(kFusedTileN, "ASYNCTP_FUSED_TILE_N", kInt, "", kMeasurement)                         \
  X(kFusedBandM, "ASYNCTP_FUSED_BAND_M", kInt, "", kMeasurement)                         \
  X(kFusedMaxSplits, "ASYNCTP_FUSED_MAX_SPLITS", kInt, "", kMeasurement)

enum class Knob {
#define ASYNCTP_KNOB_ID(id, variable, kind, words, use) id,
  ASYNCTP_KNOBS(ASYNCTP_KNOB_ID)
#undef ASYNCTP_KNOB_ID
};

// The variable's name, e.g. "ASYNCTP_TIMEOUT_MS".
const char* knob_name(Knob knob);

// A kInt knob's value, or `fallback` where it is unset or empty. A value that is not a positive
// integer throws asynctp::Error naming the variable.
int knob_int(Knob knob, int fallback);

// A kFlag knob: unset, empty or "0" is off, "1" is on; anything else throws asynctp::Error naming it.
bool knob_flag(Knob knob);

// A kWord knob: the index of its value in the knob's words, or -1 where it is unset or empty. Another
// value throws asynctp::Error naming the variable and the words it takes.
int knob_word(Knob knob);

// A kText knob's value, empty where it is unset.
std::string knob_text(Knob knob);

// Whether CUDA_DEVICE_MAX_CONNECTIONS is 1 (Megatron-LM's setting): then every stream of the device
// shares one hardware queue, and work enqueued after a kernel that waits for it may never start.
// Read once, as CUDA reads it once when the process's context is made.
bool one_device_connection();

// `requested` if > 0, else ASYNCTP_TIMEOUT_MS, else kDefaultTimeoutMs.
int resolve_timeout_ms(int requested);

}  // namespace asynctp::detail
