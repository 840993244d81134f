// Internal: what the fused GEMM needs to know to run as the partial product of a reduce-scatter
// (docs/fused_reduce_scatter.md). Read by the tile scheduler (async_input_scheduler.cuh) and, on two
// ranks, by the epilogue (reduce_scatter_epilogue.cuh).
//
// Rows [d*m, (d+1)*m) of the product belong to rank d. A tile of another rank's rows is "staged" in
// this rank's staging buffer, counted into staged(d, piece), and pushed by the copy engine to rank d's
// inbox; a tile of this rank's own rows waits until every peer's copy of it has arrived and adds them
// in fp32 before it is stored into the output. Two ways to move the tiles:
//  - through the epilogue (`reduce_in_epilogue`, two ranks): a staged tile is stored by the epilogue's
//    TMA stores, row-major like the product (staging: [M, N], of which the peer's rows are written;
//    inbox: the peer's [m, N] at its slot), and counted once per tile; an own tile's epilogue reads the
//    peer's copy as its source C;
//  - through fixup() (any number of ranks): a staged tile's consumer threads store their fp32
//    accumulators, rounded to the output type, each thread its own 16-byte groups (a tile is
//    [group][thread], written and read whole by the copy engine without any layout of its own), and
//    each warp counts; no epilogue runs for it. An own tile's threads load every peer's copy and add it
//    to their accumulators in rank order before the epilogue.
#pragma once

#include <cstdint>

#include "kernels/fused/tail_split.h"
#include "kernels/wait_context.h"

namespace asynctp::kernels::fused {

// What a staged tile adds to its piece's count: through the epilogue, one; through fixup(), one per
// consumer warp.
constexpr uint32_t staged_count_per_tile(bool reduce_in_epilogue) {
  return reduce_in_epilogue ? 1u : static_cast<uint32_t>(kConsumerThreads / 32);
}

struct ReduceScatterTiles {
  int32_t rank = -1;  // -1: an ordinary GEMM
  int32_t world = 1;
  int32_t rows_per_rank = 0;   // m: a multiple of the cluster's rows, so no cluster spans two ranks
  int32_t rows_per_piece = 0;  // a multiple of the tile's rows; pieces are what the copy engine moves
  int32_t tiles_n = 0;         // tiles along N
  bool reduce_in_epilogue = false;       // see above; two ranks only
  uint32_t* staging = nullptr;           // epilogue: [M, N]; fixup: [rank d][tile of d's rows][word][thread]
  uint32_t* staged = nullptr;            // [rank d * kMaxChunksPerRank + piece]: += staged_count_per_tile per tile
  const uint32_t* inbox = nullptr;       // epilogue: [rank q][m, N]; fixup: [rank q][tile][word][thread]
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
