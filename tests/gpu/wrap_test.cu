// Communicator::wrap on an NCCL communicator the caller made (as a framework's process group has one):
// every algorithm's ops give the reference's results on it, and destroying the asynctp communicator
// leaves the caller's usable and the caller's to destroy. NCCL only (the ranks are processes): world
// size 1 on one GPU, 2 where there are two.
#include <nccl.h>

#include "ops_problems.h"

namespace asynctp {
namespace {

using namespace testing;

int ops_on_a_wrapped_communicator(RankContext& ctx) {
  RANK_CUDA(cudaSetDevice(ctx.device));
  ncclComm_t theirs = nullptr;
  RANK_CHECK(ncclCommInitRank(&theirs, ctx.world_size, ctx.nccl_id, ctx.rank) == ncclSuccess, "ncclCommInitRank");
  {
    auto comm = Communicator::wrap(theirs);
    RANK_CHECK(comm->rank() == ctx.rank && comm->world_size() == ctx.world_size && comm->device() == ctx.device,
               "the wrapped communicator's rank, size or device");
    cudaStream_t s;
    RANK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    reference::Fp32Gemm fp32;
    const int ws = ctx.world_size;
    for (Algorithm algorithm : {Algorithm::kSequential, Algorithm::kPipelined, Algorithm::kFused}) {
      OpOptions o;
      o.algorithm = algorithm;
      run_every_ag_combination(*comm, s, fp32, o);
      run_rs_case(*comm, RsCase{128 * ws, 384, 256 * ws, false, false, ReduceOp::kSum, DType::kBF16, false}, s, fp32, o);
      run_rs_case(*comm, RsCase{130 * ws, 264, 72 * ws, true, true, ReduceOp::kAvg, DType::kFP16, true}, s, fp32, o);
    }
    comm->synchronize(s);
    RANK_CUDA(cudaStreamDestroy(s));
  }
  // Still the caller's, and usable: a collective of its own, then its own destruction.
  float* x = nullptr;
  RANK_CUDA(cudaMalloc(&x, sizeof(float)));
  RANK_CHECK(ncclAllReduce(x, x, 1, ncclFloat, ncclSum, theirs, nullptr) == ncclSuccess, "ncclAllReduce after");
  RANK_CUDA(cudaDeviceSynchronize());
  RANK_CUDA(cudaFree(x));
  RANK_CHECK(ncclCommDestroy(theirs) == ncclSuccess, "ncclCommDestroy of the caller's communicator");
  return 0;
}

TEST(Wrap, EveryAlgorithmRunsOnACommunicatorTheCallerMadeAndKeeps) {
  REQUIRE_GPU_PROCESSES(1, "the caller's communicator is an NCCL one, one a GPU");
  RUN_RANK_PROCESSES(1, ops_on_a_wrapped_communicator);
  std::string why;
  if (visible_gpus(&why) >= 2) RUN_RANK_PROCESSES(2, ops_on_a_wrapped_communicator);
}

}  // namespace
}  // namespace asynctp
