// Communicator::barrier: a stream-ordered barrier across the LSA team, on epoch-valued flags.
//
// NCCL's ncclLsaBarrierSession would do the synchronisation, but it waits without bound; this one gives
// up after the communicator's timeout and says which rank never arrived.
#include "comm/barrier.h"
#include "comm/communicator_impl.h"
#include "common/check.h"
#include "common/device_fault.h"
#include "kernels/signal.cuh"

namespace asynctp {
namespace {

// One thread per peer p: announce this rank's arrival in p's pad, then wait for p's in ours.
__global__ void barrier_kernel(uint32_t* const* pads, uint32_t* epoch_counter, int me, int n,
                               kernels::WaitContext ctx) {
  __shared__ uint32_t epoch;
  if (threadIdx.x == 0) epoch = *epoch_counter + 1;
  __syncthreads();
  const int p = threadIdx.x;
  if (p < n) {
    __threadfence_system();  // everything this rank did before the barrier, before its arrival
    kernels::st_release_sys(pads[p] + me, epoch);
    kernels::wait_flag_sys(pads[me] + p, epoch, me, p, ctx, detail::FaultSite::kBarrier);
    __threadfence_system();
  }
  __syncthreads();
  if (threadIdx.x == 0) *epoch_counter = epoch;
}

}  // namespace

namespace comm {

void enqueue_barrier(uint32_t* const* pads, uint32_t* epoch, int me, int n, const kernels::WaitContext& ctx,
                     cudaStream_t stream) {
  const int threads = (n + 31) / 32 * 32;
  barrier_kernel<<<1, threads, 0, stream>>>(pads, epoch, me, n, ctx);
  ASYNCTP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace comm

void Communicator::barrier(cudaStream_t stream) {
  Impl& m = *impl_;
  const detail::RankScope scope(m.rank);
  const Impl::OrderedCall ordered(m, stream, "Communicator::barrier");
  m.enqueue_barrier(stream);
}

void Communicator::Impl::enqueue_barrier(cudaStream_t stream) {
  const kernels::WaitContext ctx{fault, static_cast<uint64_t>(timeout_ms) * 1000000ull, rank};
  comm::enqueue_barrier(barrier_pad->device_peers(), barrier_epoch, lsa.rank, lsa.size, ctx, stream);
}

}  // namespace asynctp
