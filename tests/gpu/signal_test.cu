// Signals and barriers: ping-pong of 10,000 rounds from kernels and from the host API loses no signal
// and sees no stale one; the barrier orders peers' writes, also under CUDA-graph replay; a wait that
// cannot complete ends with the timeout report within seconds.
#include <chrono>
#include <string>

#include "common/check.h"
#include "common/device_fault.h"
#include "gpu_test.h"
#include "kernels/signal.cuh"

namespace asynctp {
namespace {

using testing::make_comm;
using testing::executable_on_every_rank;
constexpr int kRounds = 10000;

struct Errors {
  unsigned int count;
  unsigned int first_round;  // 1-based; 0 while none
  unsigned int first_seen;
};

__device__ void record(Errors* e, unsigned int round, unsigned int seen) {
  if (atomicAdd(&e->count, 1u) == 0u) {
    e->first_round = round;
    e->first_seen = seen;
  }
}

// Rank 0 serves, rank 1 returns, all in one kernel per rank: each round carries a payload that must be
// visible once the flag is, and the flag must read exactly the round's epoch (no skipped or stale one).
__global__ void ping_pong_kernel(uint32_t* const* flags, uint32_t* const* data, int me, int rounds,
                                 kernels::WaitContext ctx, Errors* errors) {
  const int peer = 1 - me;
  volatile uint32_t* my_data = data[me];
  for (int i = 1; i <= rounds; ++i) {
    const uint32_t epoch = static_cast<uint32_t>(i);
    if (me == 0) {
      data[peer][0] = epoch;
      kernels::st_release_sys(flags[peer] + 0, epoch);
    }
    const uint32_t seen = kernels::wait_flag_sys(flags[me] + 0, epoch, me, 0, ctx);
    if (seen != epoch || my_data[0] != epoch) record(errors, epoch, seen);
    if (me == 1) {
      data[peer][0] = epoch;
      kernels::st_release_sys(flags[peer] + 0, epoch);
    }
  }
}

__global__ void put_value(uint32_t* where, uint32_t value) { *reinterpret_cast<volatile uint32_t*>(where) = value; }

__global__ void expect_value(const uint32_t* where, uint32_t value, Errors* errors) {
  const uint32_t seen = *reinterpret_cast<const volatile uint32_t*>(where);
  if (seen != value) record(errors, value, seen);
}

Errors read_errors(Communicator& comm, Errors* d, cudaStream_t s) {
  Errors h{};
  RANK_CUDA(cudaMemcpyAsync(&h, d, sizeof h, cudaMemcpyDeviceToHost, s));
  comm.synchronize(s);
  return h;
}

struct PairFixture {
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<SymmetricBuffer> data;
  cudaStream_t stream = nullptr;
  Errors* errors = nullptr;

  explicit PairFixture(RankContext& ctx, int timeout_ms = 0) : comm(make_comm(ctx, timeout_ms)) {
    data = SymmetricBuffer::create(*comm, 1 << 16);
    RANK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    // Stream-ordered: in-process ranks share the device, where cudaMemset and cudaFree could wait for a
    // peer's kernel that waits for this rank.
    RANK_CUDA(cudaMallocAsync(&errors, sizeof(Errors), stream));
    RANK_CUDA(cudaMemsetAsync(errors, 0, sizeof(Errors), stream));
    RANK_CUDA(cudaStreamSynchronize(stream));
  }
  uint32_t* peer_data(int lsa_rank) const { return static_cast<uint32_t*>(data->peer(lsa_rank)); }
  uint32_t* local_data() const { return static_cast<uint32_t*>(data->local()); }
  void check_no_errors(const char* what) {
    const Errors e = read_errors(*comm, errors, stream);
    RANK_CHECK(e.count == 0, what, ": ", e.count, " bad rounds, the first at round ", e.first_round, " saw ",
               e.first_seen);
  }
  ~PairFixture() {
    comm->barrier(stream);  // no rank frees memory a peer may still touch
    cudaFreeAsync(errors, stream);
    cudaStreamSynchronize(stream);
    cudaStreamDestroy(stream);
  }
};

TEST(Signals, KernelPingPongOf10000RoundsLosesNothing) {
  REQUIRE_GPUS(2);
  RUN_RANKS(2, [](RankContext& ctx) {
    PairFixture t(ctx);
    SignalPad& pad = t.comm->signals();
    const kernels::WaitContext wc{detail::device_fault_record(), static_cast<uint64_t>(t.comm->timeout_ms()) * 1000000u,
                                  ctx.rank};
    ping_pong_kernel<<<1, 1, 0, t.stream>>>(pad.device_peers(), reinterpret_cast<uint32_t* const*>(t.data->device_peers()),
                                            t.comm->lsa().rank, kRounds, wc, t.errors);
    RANK_CUDA(cudaGetLastError());
    t.check_no_errors("kernel ping-pong");
    return 0;
  });
}

TEST(Signals, HostApiPingPongOf10000RoundsLosesNothing) {
  REQUIRE_GPUS(2);
  RUN_RANKS(2, [](RankContext& ctx) {
    PairFixture t(ctx);
    SignalPad& pad = t.comm->signals();
    const int me = t.comm->lsa().rank, peer = 1 - me;
    // Rank 0 -> rank 1 travels in rank 1's flag 0 and data word 0; the reply in rank 0's flag 1 and word 1.
    for (int i = 1; i <= kRounds; ++i) {
      const uint32_t epoch = static_cast<uint32_t>(i);
      // Alternate the two wait modes; both must deliver every round.
      const WaitMode mode = (i % 2) ? WaitMode::kBounded : WaitMode::kStreamMemOp;
      if (me == 0) {
        put_value<<<1, 1, 0, t.stream>>>(t.peer_data(peer) + 0, epoch);
        pad.set(t.stream, peer, 0, epoch);
        pad.wait(t.stream, me, 1, epoch, mode);
        expect_value<<<1, 1, 0, t.stream>>>(t.local_data() + 1, epoch, t.errors);
      } else {
        pad.wait(t.stream, me, 0, epoch, mode);
        expect_value<<<1, 1, 0, t.stream>>>(t.local_data() + 0, epoch, t.errors);
        put_value<<<1, 1, 0, t.stream>>>(t.peer_data(peer) + 1, epoch);
        pad.set(t.stream, peer, 1, epoch);
      }
    }
    RANK_CUDA(cudaGetLastError());
    t.check_no_errors("host-API ping-pong");
    // And the flags hold the last epoch exactly: none was skipped or repeated past the end.
    uint32_t last = 0;
    RANK_CUDA(cudaMemcpy(&last, pad.local() + (me == 0 ? 1 : 0), sizeof last, cudaMemcpyDeviceToHost));
    RANK_CHECK(last == static_cast<uint32_t>(kRounds), "final flag ", last);
    return 0;
  });
}

TEST(Signals, WaitOnAPeersOwnFlag) {
  REQUIRE_GPUS(2);
  RUN_RANKS(2, [](RankContext& ctx) {
    PairFixture t(ctx);
    SignalPad& pad = t.comm->signals();
    const int me = t.comm->lsa().rank;
    // Rank 0 publishes in its own flag 7 (a local set); rank 1 polls that flag across NVLink.
    for (int i = 1; i <= 200; ++i) {
      const uint32_t epoch = static_cast<uint32_t>(i);
      if (me == 0) {
        put_value<<<1, 1, 0, t.stream>>>(t.local_data() + 2, epoch);
        pad.set(t.stream, 0, 7, epoch);
        pad.wait(t.stream, 1, 8, epoch);  // rank 1's acknowledgement, in rank 1's own flag 8
      } else {
        pad.wait(t.stream, 0, 7, epoch, (i % 2) ? WaitMode::kBounded : WaitMode::kStreamMemOp);
        expect_value<<<1, 1, 0, t.stream>>>(t.peer_data(0) + 2, epoch, t.errors);
        pad.set(t.stream, 1, 8, epoch);
      }
    }
    t.check_no_errors("peer-flag wait");
    return 0;
  });
}

__global__ void put_next(uint32_t* counter, uint32_t* peer_slot) {
  const uint32_t v = ++*counter;
  *reinterpret_cast<volatile uint32_t*>(peer_slot) = v;
}

__global__ void expect_counter(const uint32_t* counter, const uint32_t* slot, Errors* errors) {
  const uint32_t seen = *reinterpret_cast<const volatile uint32_t*>(slot);
  if (seen != *counter) record(errors, *counter, seen);
}

int barrier_orders_writes(RankContext& ctx, bool in_graph) {
  PairFixture t(ctx);
  const int me = t.comm->lsa().rank, peer = 1 - me;
  uint32_t* counter;
  RANK_CUDA(cudaMallocAsync(&counter, sizeof *counter, t.stream));
  RANK_CUDA(cudaMemsetAsync(counter, 0, sizeof *counter, t.stream));
  // Each step: write round k into the peer's slot for me; barrier; my slot for the peer must hold k;
  // barrier again so the next round's write cannot overtake the read.
  auto step = [&] {
    put_next<<<1, 1, 0, t.stream>>>(counter, t.peer_data(peer) + 16 + me);
    t.comm->barrier(t.stream);
    expect_counter<<<1, 1, 0, t.stream>>>(counter, t.local_data() + 16 + peer, t.errors);
    t.comm->barrier(t.stream);
  };
  const int rounds = 1000;
  if (!in_graph) {
    for (int k = 0; k < rounds; ++k) step();
  } else {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    RANK_CUDA(cudaStreamBeginCapture(t.stream, cudaStreamCaptureModeThreadLocal));
    step();
    RANK_CUDA(cudaStreamEndCapture(t.stream, &graph));
    exec = executable_on_every_rank(ctx, graph, t.stream);
    for (int k = 0; k < rounds; ++k) RANK_CUDA(cudaGraphLaunch(exec, t.stream));
    t.comm->synchronize(t.stream);
    RANK_CUDA(cudaGraphExecDestroy(exec));
    RANK_CUDA(cudaGraphDestroy(graph));
  }
  t.check_no_errors(in_graph ? "barrier under graph replay" : "barrier");
  uint32_t n = 0;
  RANK_CUDA(cudaMemcpyAsync(&n, counter, sizeof n, cudaMemcpyDeviceToHost, t.stream));
  RANK_CUDA(cudaFreeAsync(counter, t.stream));
  t.comm->synchronize(t.stream);
  RANK_CHECK(n == static_cast<uint32_t>(rounds), "ran ", n, " rounds");
  return 0;
}

TEST(Barrier, OrdersPeersWrites) {
  REQUIRE_GPUS(2);
  RUN_RANKS(2, [](RankContext& ctx) { return barrier_orders_writes(ctx, false); });
}

TEST(Barrier, OrdersPeersWritesUnderGraphReplay) {
  REQUIRE_GPUS(2);
  RUN_RANKS(2, [](RankContext& ctx) { return barrier_orders_writes(ctx, true); });
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(Timeouts, WaitOnAFlagNobodySetsEndsWithTheReport) {
  REQUIRE_GPUS(1);
  RUN_RANKS(1, [](RankContext& ctx) {
    auto comm = make_comm(ctx, /*timeout_ms=*/1500);
    cudaStream_t s;
    RANK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const auto t0 = std::chrono::steady_clock::now();
    comm->signals().wait(s, 0, 5, 1);
    std::string message;
    try {
      comm->synchronize(s);
    } catch (const Error& e) {
      message = e.what();
    }
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("after %.2f s: %s\n", took, message.c_str());
    RANK_CHECK(contains(message, "a signal wait on rank 0 timed out after"), message);
    RANK_CHECK(contains(message, "flag 5 of rank 0 is 0, expected >= 1"), message);
    RANK_CHECK(took >= 1.4 && took < 10.0, "took ", took, " s");
    return 0;
  });
}

TEST(Timeouts, BarrierWithAnAbsentPeerEndsWithTheReport) {
  REQUIRE_GPUS(2);
  RUN_RANKS(2, [](RankContext& ctx) {
    auto comm = make_comm(ctx, /*timeout_ms=*/1500);
    if (ctx.rank == 0) {
      cudaStream_t s;
      RANK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      comm->barrier(s);  // rank 1 never comes
      std::string message;
      try {
        comm->synchronize(s);
      } catch (const Error& e) {
        message = e.what();
      }
      std::printf("%s\n", message.c_str());
      RANK_CHECK(contains(message, "a barrier on rank 0 timed out after"), message);
      RANK_CHECK(contains(message, "LSA rank 1 did not arrive"), message);
    }
    // A bound of the test's own, not ASYNCTP_TIMEOUT_MS: rank 0's trapped barrier takes seconds to end.
    ctx.barrier(/*timeout_ms=*/30000);
    // Rank 0's context is gone, so a collective teardown could not complete: rank 1 leaves its
    // communicator to the exiting process.
    if (ctx.rank == 1) (void)comm.release();
    return 0;
  });
}

}  // namespace
}  // namespace asynctp
