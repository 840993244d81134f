// Internal: what the fused GEMM needs to know to run as the partial product of a reduce-scatter
// (docs/fused_reduce_scatter.md). Read by the tile scheduler's fixup (async_input_scheduler.cuh).
//
// Rows [d*m, (d+1)*m) of the product belong to rank d. A tile of another rank's rows is "staged": its
// consumer threads store their fp32 accumulators, rounded to the output type, to this rank's staging
// buffer, each thread its own 16-byte groups (so a tile is [group][thread], written and read whole by
// the copy engine without any layout of its own), and each warp counts into staged(d, piece); no
// epilogue runs for it.
// A tile of this rank's own rows waits until every peer's copy of that tile has arrived in this rank's
// inbox, adds them to its accumulators in fp32 in rank order, and runs the epilogue into the output.
#pragma once

#include <cstdint>

#include "kernels/fused/tail_split.h"
#include "kernels/wait_context.h"

namespace asynctp::kernels::fused {

// What a staged tile adds to its piece's count: one per consumer warp.
constexpr uint32_t kStagedCountPerTile = static_cast<uint32_t>(kConsumerThreads / 32);

struct ReduceScatterTiles {
  int32_t rank = -1;  // -1: an ordinary GEMM
  int32_t world = 1;
  int32_t rows_per_rank = 0;   // m: a multiple of the cluster's rows, so no cluster spans two ranks
  int32_t rows_per_piece = 0;  // a multiple of the tile's rows; pieces are what the copy engine moves
  int32_t tiles_n = 0;         // tiles along N
  uint32_t* staging = nullptr;           // [rank d][tile of d's rows][word][thread]
  uint32_t* staged = nullptr;            // [rank d * kMaxChunksPerRank + piece]: += kStagedCountPerTile per tile
  const uint32_t* inbox = nullptr;       // [rank q][tile of this rank's rows][word][thread]
  const uint32_t* arrived = nullptr;     // arrived(q, piece) at arrived[q * flag_stride + piece]
  const uint32_t* epoch = nullptr;       // arrived when >= *epoch
  // Non-zero: the call's epoch, known to the host, and the kernel starts it itself instead of a kernel
  // launched before it (docs/fused_reduce_scatter.md, "The epoch without a kernel"): arrived when >=
  // begin_epoch, and each warp stores it to `epoch_out` (the word `epoch` points at) before it counts
  // a staged tile, so that the copy engine's flag copies after that count carry it. Not part of the
  // kept launch parameters: it is written into them at every launch.
  uint32_t begin_epoch = 0;
  uint32_t* epoch_out = nullptr;
  int32_t flag_stride = 0;
  int32_t pad_index = 0;  // index of arrived[0] in this rank's pad, for the timeout report
  WaitContext wait{};
};

}  // namespace asynctp::kernels::fused
