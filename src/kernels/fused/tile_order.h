// Internal: the band depth of the fused GEMM's tile order (async_input_scheduler.cuh), where it is
// more than a matter of speed. Host code only.
#pragma once

#include <cstdint>

namespace asynctp::kernels::fused {

// A reduce-scatter's band of cluster rows (`cluster_rows` rows each: kClusterRows, or kTileRows in
// one-CTA clusters): the deepest up to 8 that divides both a rank's rows and a chunk's, so that no band
// holds rows of two ranks or two chunks. A band that held another rank's rows and this rank's own would
// put a tile that waits for the peers before tiles the peers wait for, which the deadlock argument
// (docs/design/fused_matmul_reduce_scatter.md) rules out. Both counts are multiples of `cluster_rows`.
int reduce_scatter_band_m(int64_t rows_per_rank, int64_t rows_per_chunk, int64_t cluster_rows);

}  // namespace asynctp::kernels::fused
