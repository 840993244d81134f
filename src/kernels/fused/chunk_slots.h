// Internal: how many flag and counter slots the fused kernels keep per rank, one per chunk of its rows.
#pragma once

namespace asynctp::kernels::fused {

// The most chunks a rank's rows are cut into; the host side's public limit (kMaxChunksPerRank) is
// checked equal where the flags are laid out (algo/overlap_resources.h).
constexpr int kChunkSlots = 16;

// The fused reduce-scatter's counters in this GPU's memory, for a team of `ranks`: one per (rank the
// tiles are for, chunk), which the kernel raises as it stages that rank's tiles, then the done
// signal's count of finished warps (done_signal.h). Laid out here once, for the op and the lab; the
// kernel's ReduceScatterTiles::staged_index computes `of` on the device.
struct StagedCounters {
  int ranks = 0;
  static constexpr int of(int rank, int chunk) { return rank * kChunkSlots + chunk; }
  constexpr int finished_warps() const { return ranks * kChunkSlots; }
  constexpr int words() const { return ranks * kChunkSlots + 1; }
};

}  // namespace asynctp::kernels::fused
