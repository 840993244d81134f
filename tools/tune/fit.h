// asynctp-tune's side of the cache: what a file already holds (so that a run resumes), and the rates
// Algorithm::kAuto's model estimates untuned shapes with (GEMM rate, collective rate, fixed costs),
// fitted to what was measured at the tuned shapes.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "tune/choice.h"

namespace asynctp::tune {

// One tuned shape's measurements (a "choice" line of the cache).
struct Measured {
  ProblemKey key;
  double gemm_us = 0;        // the GEMM alone
  double comm_us = 0;        // the NCCL collective alone
  double sequential_us = 0;
  double overlapped_us = 0;  // the fastest pipelined or fused candidate; 0: none ran
};

// The tuned shapes a cache file holds, by problem_key_text of their keys (empty if there is no
// file); resuming asynctp-tune skips them. Throws asynctp::Error where a line is not valid.
std::map<std::string, Measured> read_measured(const std::string& path);
// Where `path` ends in a line with no newline (a run that was stopped while writing it): a line that
// is not a whole object is cut off, and returned; a whole one gets its newline, and "" is returned.
// Run once, before the ranks read the file, so that a resumed run appends on a line of its own.
std::string drop_truncated_last_line(const std::string& path);
std::string problem_key_text(const ProblemKey& key);

// Rates for one (GPU model, world size, op): least squares for the GEMM (time = FLOPs / rate + fixed)
// and for the collective (time = bytes / rate + fixed); the copy engine's rate taken as the
// collective's; the overlapped paths' fixed cost as the 75th percentile of what the measured
// overlapped times exceed max(GEMM, copy + GEMM / world) by. Defaults where fewer than two shapes.
Rates fit_rates(const std::vector<Measured>& shapes);

}  // namespace asynctp::tune
