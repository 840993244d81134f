// An all-reduce of one's own on asynctp's symmetric memory (the C API) and device signals
// (asynctp/device/signals.cuh): every rank copies its input into its symmetric buffer, says so to every
// peer with a flag, and each then sums all ranks' inputs, read straight from their buffers over
// NVLink, in one kernel. The GPU test SymmetricApi.AnAllReduceOfOnesOwnIsRight checks it at world
// sizes 1 to 4; examples/one_shot_all_reduce.cu runs and times it.
//
// Flags of the symmetric handle's pad (signal_count >= 2 * world_size), all epoch-valued (call e
// writes e, so no flag is ever reset):
//   [r]               rank r's input of this call is in its buffer;
//   [world_size + r]  rank r has finished reading this rank's buffer: the next call may overwrite it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "asynctp/c_api.h"
#include "asynctp/device/signals.cuh"

namespace example {

__global__ void one_shot_all_reduce_kernel(float* const* buffers, uint32_t* const* pads, int me, int world_size,
                                           int64_t n, uint32_t epoch, asynctp::device::WaitContext wait,
                                           unsigned int* blocks_done, float* out) {
  // This rank's input is in (the copy before this kernel has finished): tell every rank.
  if (blockIdx.x == 0 && threadIdx.x < world_size) asynctp::device::put_signal(pads, threadIdx.x, me, epoch);
  // Every rank's input is in. Bounded: a rank that never comes ends this kernel with a report.
  if (threadIdx.x < world_size) asynctp::device::wait_signal(pads, me, threadIdx.x, epoch, wait);
  __syncthreads();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float sum = 0.0f;
    for (int r = 0; r < world_size; ++r) sum += buffers[r][i];  // the same order on every rank
    out[i] = sum;
  }
  // The last block to finish tells every rank that this rank no longer reads their buffers.
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(blocks_done, 1u) == gridDim.x - 1) {
      *blocks_done = 0;  // for the next call
      for (int r = 0; r < world_size; ++r) asynctp::device::put_signal(pads, r, world_size + me, epoch);
    }
  }
}

// out[i] = the sum over ranks of their in[i], i < n, on every rank. Collective; call e of a handle
// passes epoch e (1, 2, ...). The symmetric buffer holds at least n floats; blocks_done is a zeroed
// device word of this rank's own. Returns 0; -1 where the C API refused (asynctp_last_error() says
// why); or the cudaError_t of a CUDA call that failed.
inline int one_shot_all_reduce(asynctp_symmetric* sym, const asynctp_symmetric_info& info, const float* in,
                               float* out, int64_t n, uint32_t epoch, unsigned int* blocks_done,
                               cudaStream_t stream) {
  const int me = info.rank, ws = info.world_size;
  // The peers have read this rank's buffer in the last call (at the first call the flags are 0).
  for (int r = 0; r < ws; ++r) {
    if (r == me) continue;
    if (asynctp_symmetric_wait_signal(sym, me, ws + r, epoch - 1, stream) != 0) return -1;
  }
  const cudaError_t copied = cudaMemcpyAsync(info.buffer, in, n * sizeof(float), cudaMemcpyDeviceToDevice, stream);
  if (copied != cudaSuccess) return copied;
  asynctp::device::WaitContext wait;
  wait.fault = static_cast<asynctp::device::Fault*>(info.wait.fault);
  wait.timeout_ns = info.wait.timeout_ns;
  wait.rank = info.wait.rank;
  const int blocks = static_cast<int>((n + 255) / 256 < 132 ? (n + 255) / 256 : 132);
  one_shot_all_reduce_kernel<<<blocks > 0 ? blocks : 1, 256, 0, stream>>>(
      static_cast<float* const*>(info.buffer_ptrs_dev), static_cast<uint32_t* const*>(info.signal_pad_ptrs_dev), me,
      ws, n, epoch, wait, blocks_done, out);
  return cudaGetLastError();
}

}  // namespace example
