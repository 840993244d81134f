// The watchdog on one GPU, without a peer to lose: a call that runs on the GPU longer than 1.5 times
// its communicator's timeout is overdue, however it came to be. Here the timeout is 5 ms and the call
// a sequential all_gather_matmul whose GEMM takes tens of ms (65536 x 16384 x 16384 on one rank): the
// watchdog puts the CUDA context in error, so that the GPU's next wait fails, and the communicator's
// next use raises the watchdog's report naming the call. (The caller's own wait on this call may still
// succeed: a GEMM that holds every SM leaves the trapping kernel no room until it ends. A peer that
// dies mid-call: faults_test.cu.)
#include <unistd.h>

#include <cstdio>

#include "ops_problems.h"

namespace asynctp {
namespace {

using namespace asynctp::testing;

int a_long_call_is_ended(RankContext& ctx) {
  auto comm = make_comm(ctx, /*timeout_ms=*/5);
  Stream st;
  constexpr int64_t M = 65536, N = 16384, K = 16384;
  Buf a(M * K * 2), b(K * N * 2), out(M * N * 2);
  RANK_CUDA(cudaMemsetAsync(a.p, 0, M * K * 2, st.s));
  RANK_CUDA(cudaMemsetAsync(b.p, 0, K * N * 2, st.s));
  RANK_CUDA(cudaStreamSynchronize(st.s));
  OpOptions o;
  o.algorithm = Algorithm::kSequential;
  all_gather_matmul(*comm, TensorRef::dense(a.p, DType::kBF16, {M, K}), {TensorRef::dense(b.p, DType::kBF16, {K, N})},
                    0, {TensorRef::dense(out.p, DType::kBF16, {M, N})}, TensorRef{}, st.s, o);
  const cudaError_t waited = cudaStreamSynchronize(st.s);
  std::string message;
  try {
    comm->synchronize(st.s);
  } catch (const Error& e) {
    message = e.what();
  }
  std::printf("rank 0: the caller's wait returned %s; then %s\n", cudaGetErrorName(waited), message.c_str());
  const cudaError_t next = cudaDeviceSynchronize();  // waits for the trapping kernel too
  std::printf("rank 0: the next wait returned %s\n", cudaGetErrorName(next));
  RANK_CHECK(next != cudaSuccess, "the context is not in error although the call ran past the bound");
  RANK_CHECK(contains(message, "all_gather_matmul on rank 0 ran on the GPU for") &&
                 contains(message, "The watchdog put this process's CUDA context"),
             message);
  // The context is gone: end without freeing, as the docs tell a process whose communicator broke.
  (void)comm.release();
  std::fflush(stdout);
  ::_exit(0);
}

TEST(Watchdog, ACallRunningPastTheBoundIsReportedAndEndsTheContext) {
  REQUIRE_GPU_PROCESSES(1, "the watchdog ends the rank's process");
  RUN_RANKS(1, a_long_call_is_ended);
}

}  // namespace
}  // namespace asynctp
