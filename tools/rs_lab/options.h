// asynctp-rs-lab's command line: the partial GEMMs it runs and the calls it times (main.cu).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace asynctp::rs_lab {

struct Options {
  std::vector<std::array<int64_t, 3>> shapes = {
      {4096, 3584, 4096}, {2048, 3584, 4096}, {4096, 6656, 8192}, {16384, 8192, 4096}, {12288, 7168, 2048}};
  int iters = 30;
  int warmup = 5;
  int chunks = 0;  // 0: as the op chooses
  bool queued = false;
  std::string trace;
  std::vector<std::string> calls;  // empty: all of kCalls
};

// The calls the lab can time, in the order of its table's columns (and the trace files' names).
struct CallKind {
  const char* name;
  enum { kCublas, kCublasWithC, kPlain, kReduceScatter } what;
  bool epilogue = false;   // a reduce-scatter's way
  bool signalled = false;  // and its flags
  bool pushed = false;     // the epilogue's way, pushed from the kernel
};
constexpr CallKind kCalls[] = {
    {"cublaslt", CallKind::kCublas},
    {"cublaslt-c", CallKind::kCublasWithC},
    {"plain", CallKind::kPlain},
    {"epilogue-preset", CallKind::kReduceScatter, true, false},
    {"epilogue-signalled", CallKind::kReduceScatter, true, true},
    {"fixup-preset", CallKind::kReduceScatter, false, false},
    {"fixup-signalled", CallKind::kReduceScatter, false, true},
    {"epilogue-pushed", CallKind::kReduceScatter, true, true, true},
};

// The options of argv; --help prints the usage and exits 0; bad input throws asynctp::Error.
Options parse(int argc, char** argv);

}  // namespace asynctp::rs_lab
