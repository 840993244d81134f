// Internal: a timeline of the fused kernel's tiles, for finding where its time goes (there is no
// profiler on the GPU machine that can follow a kernel which waits on another GPU).
//
// With ASYNCTP_TRACE_TILES=DIR, every fused call gives its kernel a record per (work unit, CTA of the
// cluster), which consumer thread 0 fills from the GPU's global timer, and the call (after its last
// enqueue, so that no peer waits on it) synchronizes and writes DIR/<op>_<M>x<N>x<K>_rank<r>.csv. A
// later call of the same shape overwrites it: the file holds the last call. Off, the kernel tests one
// null pointer per tile. docs/design/fused_matmul_reduce_scatter.md shows how to read it
// (scripts/tables/tile_trace_summary.py).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

namespace asynctp::kernels::fused {

struct FusedGemmArgs;

// Words of one record, and what each holds (nanoseconds from the GPU's global timer).
enum TraceWord : int {
  kTraceTile = 0,         // M_idx << 32 | N_idx (CTA tiles)
  kTraceUnit = 1,         // cluster << 32 | split << 16 | splits << 1 | staged (a reduce-scatter tile of a peer's rows)
  kTraceStart = 2,        // the CTA's start, in the record of its first unit only (0 in the others)
  kTraceFixupEnter = 3,   // the mainloop's end: accumulators whole
  kTraceWaitDone = 4,     // the last wait in fixup returned (split partials, or the peers' chunks); 0: none
  kTraceFixupExit = 5,    // staging or reduction done
  kTraceEpilogueDone = 6, // the epilogue's stores issued (or skipped, for a staged tile)
  kTraceProducerStart = 7, // the CTA's first unit only: its mainloop producer past the kernel's prologue (0: other units)
  kTraceWords = 8,
};

// CTAs per cluster (the scheduler's units are cluster tiles, one record per CTA of each).
constexpr int kTraceCtasPerCluster = 2;

// Host side. A zeroed device buffer with room for the records of a launch of `args`, where
// ASYNCTP_TRACE_TILES is set; null (tracing off) otherwise.
uint64_t* tile_trace_buffer(const FusedGemmArgs& args, cudaStream_t stream);

// Writes the records of the launch of `args` (whose stream the caller has synchronized) to
// $ASYNCTP_TRACE_TILES/<op>_<M>x<N>x<K>_rank<rank>.csv, times in ns from the first CTA's start.
void write_tile_trace(const char* op, const FusedGemmArgs& args, int rank);

// The first CTA's start and the last epilogue's end of the launch of `args` (stream synchronized),
// in the GPU's global-timer nanoseconds, so that a caller that stamps the timer before and after
// the launch can see what the kernel spends outside its tiles (asynctp-rs-lab --trace).
struct TileTraceSpan {
  uint64_t first_start_ns = 0;
  uint64_t last_epilogue_ns = 0;
};
TileTraceSpan tile_trace_span(const FusedGemmArgs& args);

// Where the call's time goes outside the kernel: GPU events (and host clock readings) at named points
// of a fused call, written beside the tile trace as <op>_<M>x<N>x<K>_rank<r>.calls: for each mark,
// when the stream reached it and when the host passed it, in µs from the first mark. Inert where
// ASYNCTP_TRACE_TILES is unset.
class CallTimeline {
 public:
  explicit CallTimeline(cudaStream_t stream);
  ~CallTimeline();
  CallTimeline(const CallTimeline&) = delete;
  CallTimeline& operator=(const CallTimeline&) = delete;

  void mark(const char* name);
  // Called by the public ops as they are entered, so that the file shows the host's time from there
  // to the first mark (validation, the plan, the algorithm's choice) as op_entry.
  static void note_op_entry();
  // After the stream has been synchronized.
  void write(const char* op, const FusedGemmArgs& args, int rank);

 private:
  struct Mark;
  cudaStream_t stream_;
  Mark* marks_ = nullptr;
  int count_ = 0;
};

}  // namespace asynctp::kernels::fused
