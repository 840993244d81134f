// Internal: how the fused GEMM learns that rows of A have arrived (read by async_input_mainloop.cuh).
#pragma once

#include <cstdint>

#include "kernels/wait_context.h"

namespace asynctp::kernels::fused {

// Row r of A belongs to rank q = r / rows_per_rank and to that rank's chunk
// j = (r - q * rows_per_rank) / rows_per_chunk; it is in place once flags[q * flag_stride + j] >= *epoch.
struct ChunkFlags {
  const uint32_t* flags = nullptr;  // null: every row is in place (a plain GEMM)
  const uint32_t* epoch = nullptr;
  int32_t flag_stride = 0;
  int32_t rows_per_rank = 1;
  int32_t rows_per_chunk = 1;
  int32_t pad_index = 0;  // index of flags[0] in its signal pad, for the timeout report
  WaitContext wait{};
};

}  // namespace asynctp::kernels::fused
