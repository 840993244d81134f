// Internal: how many flag and counter slots the fused kernels keep per rank, one per chunk of its rows.
#pragma once

namespace asynctp::kernels::fused {

// The most chunks a rank's rows are cut into; the host side's public limit (kMaxChunksPerRank) is
// checked equal where the flags are laid out (algo/overlap_resources.h).
constexpr int kChunkSlots = 16;

}  // namespace asynctp::kernels::fused
