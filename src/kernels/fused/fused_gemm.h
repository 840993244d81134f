// Internal: the fused GEMM, seen from the host. C = alpha * A @ B on one GPU, one persistent CUTLASS
// Hopper kernel (the async-input scheduler and mainloop in this folder) in one of two roles:
//  - all-gather: the rows of A arrive in chunks while the kernel runs (`chunks`);
//  - reduce-scatter: the product's rows belong to ranks; other ranks' tiles are staged for the copy
//    engine, and this rank's own tiles add the peers' staged tiles before the epilogue (`rs`).
// No CUTLASS here, so algorithms include it freely.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/element.h"
#include "kernels/fused/chunk_flags.h"
#include "kernels/fused/done_signal.h"
#include "kernels/fused/reduce_scatter_tiles.h"
#include "kernels/fused/tile_shape.h"

namespace asynctp::kernels::fused {

struct FusedGemmArgs {
  Element dtype = Element::kBF16;      // A and B, and C but where A and B are fp8 (C `out` then)
  Layout b_layout = Layout::kRowMajor;  // B: [K, N] row-major or [N, K] column-major
  int64_t M = 0, N = 0, K = 0;
  const void* a = nullptr;        // A [M, K], row-major: rows appear as their chunk flags are set
  const void* a_local = nullptr;  // this rank's rows [local_begin, local_end) of A, there from the start
  int64_t local_begin = 0, local_end = 0;
  const void* b = nullptr;        // [K, N] (kRowMajor) or [N, K] (kColMajor)
  void* c = nullptr;              // rows [c_row0, c_row0 + (rows the kernel stores)) of [M, N], row-major
  int64_t c_row0 = 0;             // reduce-scatter: the first of this rank's rows; else 0
  float alpha = 1.0f;
  // fp8: the product's element, bf16 or fp16 (a reduce-scatter's staged and reduced tiles, and the
  // bias, are of it too); 16-bit inputs give their own, whatever this holds.
  Element out = Element::kBF16;  // no padding anywhere here: a kept launch is found by comparing bytes (same_launch)
  // Where set, alpha is read from this device float as the kernel starts (fp8: a_scale * b_scale).
  const float* alpha_ptr = nullptr;
  // fp8 with row-wise scales, both set or neither (alpha then unused): C[m, n] = row_scales[m] *
  // (A @ B)[m, n] * col_scales[n], A's scales for every row of A and B's for each of its N columns,
  // in device memory on 16-byte boundaries; a row's scale is read once its rows are in (an
  // all-gather's tiles wait for their rows' flags first).
  const float* row_scales = nullptr;
  const float* col_scales = nullptr;
  // fp8: an [N] bias of `out`'s type added to every row after the scales (C = scaled product + bias), in device
  // memory on a 16-byte boundary; null: none. A reduce-scatter's partial product takes its own in
  // ReduceScatterTiles (rs.bias).
  const void* bias = nullptr;
  ChunkFlags chunks;              // chunks.flags null: every row of `a` is in place (a plain GEMM)
  int band_m = 0;                 // tile order (async_input_scheduler.cuh); 0 picks the default
  // 192, 256 or kWideTileN (16 bits); or 128: kOneRowTileN in one-CTA clusters (M <= kTileRows, one_cta_takes, a reduce-scatter's
  // odd tile rows a rank), else kPingpongTileN (the ping-pong schedule); fp8 takes 128, 256, and 192 with
  // row-wise scales (kPingpongWideTileN, the ping-pong schedule); 0 picks it (one_cta_takes,
  // split_192_takes, pingpong_takes, pick_tile_n, pingpong_192_takes; a reduce-scatter's: reduce_scatter_tile_n).
  int tile_n = 0;
  // Lets the kernel split its last round of tiles along K (tail_split.h): tail_split_workspace_bytes(
  // split_sms) bytes whose counters start at zero (algo::Resources::tail_split_workspace). Null:
  // every tile is computed whole. split_wait bounds the wait of a tile's last split for the others.
  void* split_workspace = nullptr;
  int split_sms = 0;
  int max_splits = 0;  // 0: kMaxTailSplits, or ASYNCTP_FUSED_MAX_SPLITS where set (1: no split)
  // SMs the persistent grid may fill (whole 2-SM clusters; the communicator's sm_budget); 0: every SM.
  int sms = 0;
  int32_t unused1 = 0;
  ReduceScatterTiles rs;  // rs.rank >= 0: the partial product of a reduce-scatter (tiles tile_n wide, 0: kRsTileN)
  WaitContext split_wait{};
  uint64_t* trace = nullptr;  // a tile timeline (tile_trace.h); null: none
  const DoneSignal* done = nullptr;  // in device memory; non-null: the kernel tells the peers it is done (done_signal.h)
};

// Why the kernel cannot take this problem ("" when it can): the TMA needs 16-byte aligned rows (N and
// K multiples of 8) and 16-byte aligned pointers, and indices fit in 32 bits.
const char* fused_gemm_unsupported(const FusedGemmArgs& args);

// The cooperative kernel's tile width for an M x N x K GEMM on `sms` SMs by its estimate alone:
// kOneRowTileN for a problem of one tile row (one-CTA clusters: tile_shape.h); else 192 or 256, the
// one whose rounds of tiles (the last one split along K where tail_split.h would), times the tile's
// width, cost less (by 5% for the narrower; no more than `max_splits` ways), or kWideTileN where its
// tiles make whole rounds that cost 5% less than that, counted kWideTileRoundCost times their width.
// kWideTileN only where `wide_allowed`: a kernel with no peer, since its fewer rounds leave the
// kernel no other tiles to run while a peer's rows arrive or its staged tiles leave (on two H200s the
// fused reduce-scatter at 1024 x 5120 x 5120 took 86-88 us in them against 66-76 in 192-wide tiles).
// The rules that come first are tile_n_above_one_row's. ASYNCTP_FUSED_TILE_N=128|192|256|320
// overrides the width for measurement.
int pick_tile_n(int64_t M, int64_t N, int64_t K, int sms, int max_splits, bool wide_allowed = true);

// ASYNCTP_FUSED_TILE_N, the tile width forced for measurement: 0 where it is not set, else
// kOneRowTileN (kPingpongTileN above one tile row), 192, 256 or kWideTileN; throws asynctp::Error
// naming the variable on any other value. Each op's launch takes the widths it has (tile_n_for in
// fused_gemm.cc, reduce_scatter_tile_n) and keeps its own choice for the others.
int forced_tile_n();

// The tile width of an M x N x K problem above one tile row that no one-CTA rule took, by the same rule
// for both ops (an all-gather's launch and reduce_scatter_tile_n): in 16 bits 192 where
// split_192_takes (unless `split_192_allowed` is false); then kPingpongTileN, the ping-pong schedule,
// where pingpong_takes, and in fp8 at any size where K < kFp8PingpongBelowK or
// fp8_pingpong_fills_better; else 256 in fp8 (no
// cooperative 192- or 320-wide fp8 tiles; an all-gather with row-wise scales may then take
// pingpong_192_takes's instead, in tile_n_for) and pick_tile_n's width in 16 bits.
int tile_n_above_one_row(int64_t M, int64_t N, int64_t K, int sms, Element dtype, int max_splits,
                         bool split_192_allowed, bool wide_allowed);

// Whether a 16-bit M x N x K GEMM above one tile row runs cooperative 192-wide tiles, ahead of
// pick_tile_n's estimate and of the ping-pong schedule: where those tiles make less than one round
// on `sms` SMs and the plan splits them at least 3 ways along K of at least kSplit192MinKTiles steps.
// Each SM then does a third of a 192-wide tile or less, where the ping-pong's one round gives it a
// whole 128-wide one and 256-wide tiles split 4 ways add more partial sums
// (docs/design/fused_all_gather_matmul.md, "Cooperative 192-wide tiles split three ways"). An
// all-gather whose rank's rows straddle a tile does not take them (fused_gemm.cc, tile_n_for).
constexpr int64_t kSplit192MinKTiles = 64;
bool split_192_takes(int64_t M, int64_t N, int64_t K, int sms, int max_splits);

// Whether an all-gather's 16-bit M x N GEMM of an odd number of tile rows above one (384 rows, 640, ...)
// runs kOneRowTileN-wide tiles in one-CTA clusters, as a problem of one tile row does: where those
// tiles fit one round on `sms` SMs. A 2 x 1 cluster's last row of tiles there is half empty
// (docs/design/fused_all_gather_matmul.md, "One-CTA clusters at an odd number of tile rows").
bool one_cta_takes(int64_t M, int64_t N, int sms, Element dtype);

// Whether an M x N GEMM of more than one tile row on `sms` SMs runs the ping-pong schedule's
// kPingpongTileN-wide tiles (never split along K): where it has at most one such cluster tile per
// cluster in 16 bits, three in fp8. The all-gather's kernel asks it, and the reduce-scatter's where
// it reduces in fixup() (reduce_scatter_tile_n). There the ping-pong runs faster than the cooperative
// tiles with their split tail; beyond, slower (docs/design/fused_all_gather_matmul.md, "The ping-pong
// schedule for a few rounds of tiles").
bool pingpong_takes(int64_t M, int64_t N, int sms, Element dtype);

// fp8 runs the ping-pong schedule at every size where K is below this (a tile's mainloop of fewer than
// 64 steps): there its epilogue, overlapped with the other warpgroup's mainloop, saves more than its
// 128 x 128 tiles' extra L2 traffic costs in clock (one H200: 4-18% less time at K of 1024 to 5120;
// level at 8192 but for 4096 x 3584; slower at 16384: docs/design/fused_all_gather_matmul.md).
constexpr int64_t kFp8PingpongBelowK = 8192;

// The share of its rounds' tile area that an M x N product fills in `tile_n`-wide tiles of 2 x 1
// clusters on `sms` SMs (ragged M and N counted empty).
double rounds_filled(int64_t M, int64_t N, int64_t tile_n, int sms);

// Whether fp8 at K = kFp8PingpongBelowK, where the rule above stops, still runs the ping-pong
// schedule: where the cooperative 256-wide tiles fill less than kFp8CooperativeMinFilled of their
// rounds and the 128-wide tiles fill more (one H200, under ncu, both ops and scale kinds: 2.3-5.0% less
// time at 4096 x 3584 x 8192, 0.85 against 0.97 filled, and 0.9-3.7% at 6144 x 3584 x 8192, 0.85
// against 0.93; level to 4% more where both fill 0.97: docs/design/fused_all_gather_matmul.md).
constexpr double kFp8CooperativeMinFilled = 0.90;
bool fp8_pingpong_fills_better(int64_t M, int64_t N, int64_t K, int sms);

// Whether fp8's all-gather with row-wise scales, where the rules above give it 256-wide tiles, runs
// kPingpongWideTileN-wide tiles in the ping-pong schedule instead: where they fill at least
// kPingpong192MinFilled of their rounds (the product's area over the rounds' tiles' on `sms` SMs,
// ragged N and M counted empty), or kPingpong192MinFilledShortK where K is at most
// kPingpong192ShortK. Those tiles run in about 8% fewer cycles than the cooperative 256-wide ones, at
// a clock about 5% lower, and are never split along K, where the cooperative kernel splits its last
// round; the shorter the mainloop, the more the cooperative kernel's exposed epilogue costs against
// that split (one H200, under ncu: 4% and 2% less time at 8192 x 8192 x 8192 and 16384 x 8192 x 8192,
// 0.985 filled; 1.7%, 0.5% and 1.7% less at K = 8192 and 0.905, 0.94 and 0.97 filled; 1.6% and 3.5%
// more at 16384 x 4096 x 14336 and 4096 x 6656 x 16384, 0.94 and 0.93 filled; 8% more at 2048 x 3584 x
// 8192, 0.75: docs/design/fused_all_gather_matmul.md).
constexpr double kPingpong192MinFilled = 0.98;
constexpr double kPingpong192MinFilledShortK = 0.90;
constexpr int64_t kPingpong192ShortK = 8192;
bool pingpong_192_takes(int64_t M, int64_t N, int64_t K, int sms);

// The tile width of the all-gather's (or a plain GEMM's) launch `args` on `sms` SMs where args.tile_n
// is 0: ASYNCTP_FUSED_TILE_N where the launch has that width (fp8: 128, 256, and 192 with row-wise
// scales above one tile row), else kOneRowTileN for one tile row or where one_cta_takes, else
// tile_n_above_one_row's, and kPingpongWideTileN for a row-wise fp8 launch where pingpong_192_takes and
// that gives 256, or 128 by fp8_pingpong_fills_better where the 192-wide tiles fill their rounds at
// least as well (one H200, under ncu: 6144 x 3584 x 8192 9% less time in them, 0.97 against 0.93
// filled; 4096 x 3584 x 8192 2.6% more, 0.905 against 0.97). run_fused_gemm passes grid_sms(args).
int tile_n_for(const FusedGemmArgs& args, int sms);

// SMs of the current device.
int sm_count();
// The SMs a launch with `args` may fill: args.sms where set, else sm_count().
int grid_sms(const FusedGemmArgs& args);

// Loads every instantiation onto the current device and sets its shared-memory limit, once per
// device. CUDA loads a kernel lazily, at its first launch, and a load can wait for the device to go
// idle; with a fused kernel already spinning on flags that a peer sets only later, that wait would
// not end. Call before enqueuing the first fused call's work.
void load_fused_gemm_kernels();

// Enqueues the kernel on `stream`. Throws asynctp::Error if CUTLASS refuses the problem or the launch fails.
void run_fused_gemm(const FusedGemmArgs& args, cudaStream_t stream);

}  // namespace asynctp::kernels::fused
