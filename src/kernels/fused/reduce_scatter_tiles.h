// Internal: what the fused GEMM needs to know to run as the partial product of a reduce-scatter
// (docs/design/fused_matmul_reduce_scatter.md). Read by the tile scheduler (async_input_scheduler.cuh) and, on two
// ranks, by the epilogue (reduce_scatter_epilogue.cuh).
//
// Rows [d*m, (d+1)*m) of the product belong to rank d. A tile of another rank's rows is "staged" in
// this rank's staging buffer, counted into staged(d, chunk), and pushed by the copy engine to rank d's
// inbox; a tile of this rank's own rows waits until every peer's copy of it has arrived and adds them
// in fp32 before it is stored into the output. Two ways to move the tiles:
//  - through the epilogue (`reduce_in_epilogue`, two ranks): a staged tile is stored by the epilogue's
//    TMA stores, row-major like the product (staging: [M, N], of which the peer's rows are written;
//    inbox: the peer's [m, N] at its slot), and counted once per tile; an own tile's epilogue reads the
//    peer's copy as its source C;
//    Or, pushed from the kernel (`push_inbox`), a staged tile is stored straight into the peer's
//    inbox over NVLink and counted in the peer's pad, and the copy engine does nothing (below);
//  - through fixup() (any number of ranks): a staged tile's consumer threads store their fp32
//    accumulators, rounded to the output type, each thread its own 16-byte groups (a tile is
//    [group][thread], written and read whole by the copy engine without any layout of its own), and
//    each warp counts; no epilogue runs for it. An own tile's threads load every peer's copy and add it
//    to their accumulators in rank order before the epilogue.
#pragma once

#include <cstdint>

#include "kernels/fused/chunk_slots.h"
#include "kernels/fused/tail_split.h"
#include "kernels/fused/tile_shape.h"
#include "kernels/wait_context.h"

#if defined(__CUDACC__)
#define ASYNCTP_RS_HOST_DEVICE __host__ __device__
#else
#define ASYNCTP_RS_HOST_DEVICE
#endif

namespace asynctp::kernels::fused {

// What a staged tile adds to its chunk's count: through the epilogue, one; through fixup(), one per
// consumer warp.
constexpr uint32_t staged_count_per_tile(bool reduce_in_epilogue) {
  return reduce_in_epilogue ? 1u : static_cast<uint32_t>(kConsumerThreads / 32);
}

struct ReduceScatterTiles {
  int32_t rank = -1;  // -1: an ordinary GEMM
  int32_t world = 1;
  int32_t rows_per_rank = 0;   // m: a multiple of the cluster's rows, so no cluster spans two ranks
  int32_t rows_per_chunk = 0;  // a multiple of the tile's rows; a chunk is counted, moved and waited for whole
  int32_t tiles_n = 0;         // tiles along N
  bool reduce_in_epilogue = false;       // see above; two ranks only
  uint8_t unused0[3] = {};               // no padding anywhere here: same_launch compares bytes
  uint32_t* staging = nullptr;           // epilogue: [M, N]; fixup: [rank d][tile of d's rows][word][thread]
  uint32_t* staged = nullptr;            // [rank d * kChunkSlots + chunk]: += staged_count_per_tile per tile
  const uint32_t* inbox = nullptr;       // epilogue: [rank q][m, N]; fixup: [rank q][tile][word][thread]
  const uint32_t* arrived = nullptr;     // arrived(q, chunk) at arrived[q * flag_stride + chunk]
  const uint32_t* epoch = nullptr;       // arrived when >= *epoch
  // Non-zero: the call's epoch, known to the host, and the kernel starts it itself instead of a kernel
  // launched before it (docs/design/fused_matmul_reduce_scatter.md, "The epoch without a kernel"): arrived when >=
  // begin_epoch, and each warp stores it to `epoch_out` (the word `epoch` points at) before it counts
  // a staged tile, so that the copy engine's flag copies after that count carry it. Not part of the
  // kept launch parameters: it is written into them at every launch.
  uint32_t begin_epoch = 0;
  uint32_t unused1 = 0;
  uint32_t* epoch_out = nullptr;
  int32_t flag_stride = 0;
  int32_t pad_index = 0;  // index of arrived[0] in this rank's pad, for the timeout report
  WaitContext wait{};
  // Pushed from the kernel (two ranks, through the epilogue; push_inbox non-null): the epilogue's TMA
  // stores write a staged tile into the peer's inbox itself, and once they are complete its warp adds
  // the tile to the peer's count of its chunk (push_count) with a system-scope release; an own tile
  // waits until the peer's count of its chunk (pushed) shows every tile of the chunk. Before its
  // first store into the peer's inbox a CTA waits for the peer to be done with the call before
  // (peer_done); the kernel's last warp zeroes `pushed` before it says done, so the peer's next call
  // counts from zero.
  uint32_t* push_inbox = nullptr;       // the peer's inbox at this rank's slot: [m, N]
  uint32_t* push_count = nullptr;       // the peer's pad: pushed(this rank, chunk) at [chunk]
  uint32_t* pushed = nullptr;           // this rank's pad: pushed(peer, chunk) at [chunk], kChunkSlots
  const uint32_t* peer_done = nullptr;  // this rank's pad: the peer's done flag
  int32_t push_pad_index = 0;           // index of pushed[0] in this rank's pad, for the timeout report
  int32_t unused2 = 0;
  // Where set, a tile's whole accumulators are multiplied by *partial_scale before they are staged or
  // the peers' copies are added: the scaled op's a_scale * b_scale, which differs from rank to rank,
  // so each partial product is scaled by its own before the sum.
  const float* partial_scale = nullptr;
  // Where set (the scaled op's row-wise scales; partial_scale null then), each value of a tile's whole
  // accumulators is multiplied by row_scales[row] * col_scales[col] of its place in the product
  // instead: this rank's a_scale for each of the M rows and its b_scale for each of the `cols`
  // columns (the last tile may reach past them).
  const float* row_scales = nullptr;
  const float* col_scales = nullptr;
  int32_t cols = 0;
  int32_t unused3 = 0;
  // Where set (the scaled op's bias: `cols` values of the output's type, on a 16-byte boundary; with
  // partial_scale or row_scales only), each value of a tile's whole accumulators gains its column's
  // bias after the scales, so that every rank's partial product carries it and the sum counts it once
  // a rank (the average, once).
  const void* bias = nullptr;

  // The reduce-scatter's kernel as the one rank of one (every tile its own, nothing to add): `rows`
  // rows in one chunk, `tiles_n` tiles along N. asynctp-bench times the kernel so, and the kernel's
  // tests check it so; the scales and the bias are the caller's to set.
  static ReduceScatterTiles one_rank(int32_t rows, int32_t tiles_n) {
    ReduceScatterTiles rs;
    rs.rank = 0, rs.world = 1;
    rs.rows_per_rank = rs.rows_per_chunk = rows;
    rs.tiles_n = tiles_n;
    return rs;
  }

  // Where the tile whose first row is `row0` belongs, for the scheduler and the epilogue alike: the rank
  // that owns its rows, the chunk of that rank's rows it is in, and that chunk's staged counter. Each
  // takes what divides by rows_per_rank (`by_rank`) and rows_per_chunk (`by_chunk`): by default a
  // plain division; the scheduler, which asks for every tile, passes cutlass::FastDivmod.
  struct Divide {
    int32_t divisor;
    ASYNCTP_RS_HOST_DEVICE int32_t div(int32_t x) const { return x / divisor; }
  };
  template <class Div>
  ASYNCTP_RS_HOST_DEVICE int32_t owner_of(int32_t row0, Div const& by_rank) const {
    return by_rank.div(row0);
  }
  template <class Div>
  ASYNCTP_RS_HOST_DEVICE int32_t chunk_of(int32_t row0, Div const& by_rank, Div const& by_chunk) const {
    return by_chunk.div(row0 - owner_of(row0, by_rank) * rows_per_rank);
  }
  template <class Div>
  ASYNCTP_RS_HOST_DEVICE int32_t staged_index(int32_t row0, Div const& by_rank, Div const& by_chunk) const {
    return owner_of(row0, by_rank) * kChunkSlots + chunk_of(row0, by_rank, by_chunk);
  }
  // A reduce-scatter's tile of another rank's rows.
  template <class Div>
  ASYNCTP_RS_HOST_DEVICE bool is_staged(int32_t row0, Div const& by_rank) const {
    return rank >= 0 && owner_of(row0, by_rank) != rank;
  }
  ASYNCTP_RS_HOST_DEVICE int32_t owner_of(int32_t row0) const { return owner_of(row0, Divide{rows_per_rank}); }
  ASYNCTP_RS_HOST_DEVICE int32_t chunk_of(int32_t row0) const {
    return chunk_of(row0, Divide{rows_per_rank}, Divide{rows_per_chunk});
  }
  ASYNCTP_RS_HOST_DEVICE int32_t staged_index(int32_t row0) const {
    return staged_index(row0, Divide{rows_per_rank}, Divide{rows_per_chunk});
  }
  ASYNCTP_RS_HOST_DEVICE bool is_staged(int32_t row0) const { return is_staged(row0, Divide{rows_per_rank}); }

  // Rows of chunk `chunk` of a rank's rows: rows_per_chunk, the last chunk shorter where it does not
  // divide rows_per_rank.
  ASYNCTP_RS_HOST_DEVICE int32_t rows_in_chunk(int32_t chunk) const {
    const int32_t left = rows_per_rank - chunk * rows_per_chunk;
    return left < rows_per_chunk ? left : rows_per_chunk;
  }
  // Tiles in that chunk: the count a chunk reaches once all its tiles are in, per tile counted once
  // (the host's waits for the copy engine, and the epilogue's wait where the kernel pushes, both use it).
  ASYNCTP_RS_HOST_DEVICE uint32_t tiles_in_chunk(int32_t chunk) const {
    return static_cast<uint32_t>(rows_in_chunk(chunk) / static_cast<int32_t>(kTileRows) * tiles_n);
  }

#if defined(__CUDACC__)
  // The value the peers' arrived flags reach for this call.
  __device__ uint32_t arrival_epoch() const { return begin_epoch != 0 ? begin_epoch : *epoch; }
  // Adds `count` staged tiles to the counter of the chunk `row0` is in, with a GPU-scope release (which
  // the copy engine's wait, a stream memory operation on this GPU, then sees), after the call's epoch
  // where the kernel starts it: the flag copies that follow the count read it.
  __device__ void add_staged(int32_t row0, uint32_t count) const {
    if (begin_epoch != 0) *epoch_out = begin_epoch;
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(staged + staged_index(row0)), "r"(count) : "memory");
  }
  // Pushed from the kernel: adds `count` tiles, stored into the peer's inbox and complete there, to the
  // peer's count of the chunk `row0` is in, with a system-scope release (the peer's own tiles acquire it).
  __device__ void add_pushed(int32_t row0, uint32_t count) const {
    if (begin_epoch != 0) *epoch_out = begin_epoch;  // as add_staged: the device's epoch word follows the call
    asm volatile("red.release.sys.global.add.u32 [%0], %1;" ::"l"(push_count + chunk_of(row0)), "r"(count) : "memory");
  }
#endif
};

}  // namespace asynctp::kernels::fused

#undef ASYNCTP_RS_HOST_DEVICE
