// The C API's symmetric memory (asynctp_symmetric_*) and the public device header: every call, peers'
// memory through both pointer kinds, signals in stream order and under graph capture, an all-reduce of
// one's own (examples/one_shot_all_reduce.cuh) against sums computed on the host, bad arguments refused
// by name on every rank, and a wait on a signal nobody sends ending with the report.
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "asynctp/c_api.h"
#include "c_comm.h"
#include "one_shot_all_reduce.cuh"
#include "ops_problems.h"

namespace asynctp {
namespace {

using namespace asynctp::testing;

constexpr int kTimeoutMs = 30000;

#define C_OK(expr) RANK_CHECK((expr) == 0, #expr, ": ", asynctp_last_error())

// A symmetric handle of `bytes` and `signals` flags on `c`, destroyed with it.
struct CSymmetric {
  asynctp_symmetric* sym = nullptr;
  asynctp_symmetric_info info{};
  CSymmetric(CComm& c, uint64_t bytes, int signals) {
    C_OK(asynctp_symmetric_create(c.comm, bytes, signals, &sym));
    C_OK(asynctp_symmetric_get_info(sym, &info));
  }
  ~CSymmetric() { asynctp_symmetric_destroy(sym); }
  // The ranks' last work here is done on every rank before any frees the memory.
  void end_together(CComm& c, cudaStream_t s) const {
    C_OK(asynctp_symmetric_barrier(sym, s));
    C_OK(asynctp_comm_synchronize(c.comm, s));
  }
};

// A copy between the GPU and pageable host memory, made once `s` is idle, and finished. Such a copy
// returns only when done, and while it waits behind a wait for a peer, a copy of that peer's thread
// (ranks that are threads of one process) can wait for it: so the stream is drained first, with the
// communicator's bound.
void copy_when_idle(CComm& c, cudaStream_t s, void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  C_OK(asynctp_comm_synchronize(c.comm, s));
  RANK_CUDA(cudaMemcpyAsync(dst, src, n, kind, s));
  C_OK(asynctp_comm_synchronize(c.comm, s));
}

int every_call_works(RankContext& ctx) {
  CComm c(ctx, kTimeoutMs);
  Stream st;
  const int me = ctx.rank, ws = ctx.world_size;
  constexpr uint64_t kBytes = (1 << 20) + 3;  // rounded up by the window alignment
  CSymmetric s(c, kBytes, 2 * ws + 1);
  const asynctp_symmetric_info& info = s.info;
  RANK_CHECK(info.rank == me && info.world_size == ws, "info says rank ", info.rank, " of ", info.world_size);
  RANK_CHECK(info.bytes >= kBytes, "bytes ", info.bytes);
  RANK_CHECK(info.signal_count == 2 * ws + 1, "signal_count ", info.signal_count);
  RANK_CHECK(info.wait.fault != nullptr && info.wait.timeout_ns == kTimeoutMs * 1000000ull && info.wait.rank == me,
             "wait context");

  // Host pointers and the device arrays name the same memory; this rank's own host pointers are
  // info's, and its entry of a device array may be a second mapping of that memory (read below).
  std::vector<void*> buffers(ws), from_device(ws);
  std::vector<uint32_t*> pads(ws), pads_from_device(ws);
  for (int r = 0; r < ws; ++r) C_OK(asynctp_symmetric_peer(s.sym, r, &buffers[r], &pads[r]));
  RANK_CHECK(buffers[me] == info.buffer && pads[me] == info.signal_pad, "own pointers differ from info's");
  // Every copy is on the rank's stream: where ranks are threads of one process, a copy on the legacy
  // default stream can wait for every GPU of the process, a peer's barrier waiting for this rank
  // included.
  auto to_host = [&](void* dst, const void* src, size_t n) { copy_when_idle(c, st.s, dst, src, n, cudaMemcpyDeviceToHost); };
  to_host(from_device.data(), info.buffer_ptrs_dev, ws * sizeof(void*));
  to_host(pads_from_device.data(), info.signal_pad_ptrs_dev, ws * sizeof(void*));
  for (int r = 0; r < ws; ++r) {
    RANK_CHECK(from_device[r] != nullptr && pads_from_device[r] != nullptr, "rank ", r, "'s device pointers are NULL");
    RANK_CHECK(r == me || (from_device[r] == buffers[r] && pads_from_device[r] == pads[r]),
               "rank ", r, "'s device pointers differ from its peer pointers");
  }

  // The memory starts zeroed; each rank fills its own, and after a barrier reads every peer's.
  std::vector<unsigned char> host(kBytes);
  to_host(host.data(), info.buffer, kBytes);
  for (const unsigned char b : host) RANK_CHECK(b == 0, "a new buffer is not zeroed");
  RANK_CUDA(cudaMemsetAsync(info.buffer, me + 1, kBytes, st.s));
  C_OK(asynctp_symmetric_barrier(s.sym, st.s));
  for (int r = 0; r < ws; ++r) {
    for (void* p : {buffers[r], from_device[r]}) {
      to_host(host.data(), p, kBytes);
      for (size_t i = 0; i < kBytes; i += 4093) RANK_CHECK(host[i] == r + 1, "rank ", r, "'s byte ", i, " is ", +host[i]);
    }
  }
  C_OK(asynctp_symmetric_barrier(s.sym, st.s));

  // A ring of 200 rounds: write into the next rank's buffer with the copy engine, flag it, and wait
  // for the previous rank's; each round's data must be there once its flag is.
  const int next = (me + 1) % ws;
  // Stream-ordered allocations only: ranks may share a GPU, and cudaFree or cudaFreeHost would wait
  // for the whole GPU, a peer's wait for this rank included.
  unsigned char* seen = nullptr;
  unsigned char* bytes = nullptr;  // bytes[i] == i: the source of each round's copy
  RANK_CUDA(cudaMallocAsync(reinterpret_cast<void**>(&seen), 200, st.s));
  RANK_CUDA(cudaMallocAsync(reinterpret_cast<void**>(&bytes), 256, st.s));
  std::vector<unsigned char> all_bytes(256);
  for (int i = 0; i < 256; ++i) all_bytes[i] = static_cast<unsigned char>(i);
  copy_when_idle(c, st.s, bytes, all_bytes.data(), 256, cudaMemcpyHostToDevice);
  for (uint32_t e = 1; e <= 200; ++e) {
    RANK_CUDA(cudaMemcpyAsync(static_cast<char*>(buffers[next]) + e, bytes + (e & 0xFF), 1, cudaMemcpyDeviceToDevice,
                              st.s));
    C_OK(asynctp_symmetric_put_signal(s.sym, next, 0, e, st.s));
    C_OK(asynctp_symmetric_wait_signal(s.sym, me, 0, e, st.s));
    RANK_CUDA(cudaMemcpyAsync(seen + e - 1, static_cast<char*>(info.buffer) + e, 1, cudaMemcpyDeviceToDevice, st.s));
  }
  std::vector<unsigned char> rounds(200);
  to_host(rounds.data(), seen, 200);
  RANK_CUDA(cudaFreeAsync(seen, st.s));
  for (uint32_t e = 1; e <= 200; ++e) RANK_CHECK(rounds[e - 1] == (e & 0xFF), "round ", e, " read ", +rounds[e - 1]);

  // The same under graph capture: two graphs with their own values, each replayed once (a replay
  // waits for its captured value again, which the flag has reached already).
  for (uint32_t v = 201; v <= 202; ++v) {
    cudaGraph_t graph;
    RANK_CUDA(cudaStreamBeginCapture(st.s, cudaStreamCaptureModeThreadLocal));
    RANK_CUDA(cudaMemcpyAsync(static_cast<char*>(buffers[next]) + 7, bytes + (v & 0xFF), 1, cudaMemcpyDeviceToDevice,
                              st.s));
    C_OK(asynctp_symmetric_put_signal(s.sym, next, 0, v, st.s));
    C_OK(asynctp_symmetric_wait_signal(s.sym, me, 0, v, st.s));
    C_OK(asynctp_symmetric_barrier(s.sym, st.s));
    RANK_CUDA(cudaStreamEndCapture(st.s, &graph));
    cudaGraphExec_t exec = executable_on_every_rank(ctx, graph, st.s);
    RANK_CUDA(cudaGraphLaunch(exec, st.s));
    unsigned char b = 0;
    to_host(&b, static_cast<char*>(info.buffer) + 7, 1);
    RANK_CHECK(b == (v & 0xFF), "graph with value ", v, " read ", +b);
    RANK_CUDA(cudaGraphExecDestroy(exec));
    RANK_CUDA(cudaGraphDestroy(graph));
  }
  RANK_CUDA(cudaFreeAsync(bytes, st.s));
  s.end_together(c, st.s);
  return 0;
}

TEST(SymmetricApi, EveryCallWorks_1Rank) {
  REQUIRE_GPUS(1);
  RUN_RANKS(1, every_call_works);
}

TEST(SymmetricApi, EveryCallWorks_MultiRank) { RUN_EVERY_WORLD_SIZE(every_call_works); }

// examples/one_shot_all_reduce.cuh at an odd length, three calls with new inputs each, against sums
// computed on the host (the inputs are small integers, so every sum is exact in fp32).
int all_reduce_of_ones_own(RankContext& ctx) {
  CComm c(ctx, kTimeoutMs);
  Stream st;
  const int me = ctx.rank, ws = ctx.world_size;
  constexpr int64_t kN = 100003;
  CSymmetric s(c, kN * sizeof(float), 2 * ws);
  // Stream-ordered allocations: ranks may share a GPU (see every_call_works).
  float *in = nullptr, *out = nullptr;
  unsigned int* blocks_done = nullptr;
  RANK_CUDA(cudaMallocAsync(reinterpret_cast<void**>(&in), kN * sizeof(float), st.s));
  RANK_CUDA(cudaMallocAsync(reinterpret_cast<void**>(&out), kN * sizeof(float), st.s));
  RANK_CUDA(cudaMallocAsync(reinterpret_cast<void**>(&blocks_done), sizeof(unsigned int), st.s));
  RANK_CUDA(cudaMemsetAsync(blocks_done, 0, sizeof(unsigned int), st.s));
  auto value = [](int rank, int64_t i, uint32_t call) { return static_cast<float>((i * 7 + rank * 13 + call) % 101); };
  std::vector<float> host(kN);
  for (uint32_t call = 1; call <= 3; ++call) {
    for (int64_t i = 0; i < kN; ++i) host[i] = value(me, i, call);
    copy_when_idle(c, st.s, in, host.data(), kN * sizeof(float), cudaMemcpyHostToDevice);
    const int rc = example::one_shot_all_reduce(s.sym, s.info, in, out, kN, call, blocks_done, st.s);
    RANK_CHECK(rc == 0, "one_shot_all_reduce returned ", rc, ": ", rc == -1 ? asynctp_last_error() : cudaGetErrorString(static_cast<cudaError_t>(rc)));
    copy_when_idle(c, st.s, host.data(), out, kN * sizeof(float), cudaMemcpyDeviceToHost);
    for (int64_t i = 0; i < kN; ++i) {
      float want = 0.0f;
      for (int r = 0; r < ws; ++r) want += value(r, i, call);
      RANK_CHECK(host[i] == want, "call ", call, ", element ", i, ": ", host[i], ", expected ", want);
    }
  }
  std::printf("rank %d: one_shot_all_reduce of %lld floats right in 3 calls\n", me, static_cast<long long>(kN));
  RANK_CUDA(cudaFreeAsync(in, st.s));
  RANK_CUDA(cudaFreeAsync(out, st.s));
  RANK_CUDA(cudaFreeAsync(blocks_done, st.s));
  s.end_together(c, st.s);
  return 0;
}

TEST(SymmetricApi, AnAllReduceOfOnesOwnIsRight_1Rank) {
  REQUIRE_GPUS(1);
  RUN_RANKS(1, all_reduce_of_ones_own);
}

TEST(SymmetricApi, AnAllReduceOfOnesOwnIsRight_MultiRank) { RUN_EVERY_WORLD_SIZE(all_reduce_of_ones_own); }

// Each refusal names its argument; a creation refused on rank 0 fails every rank at once.
int bad_arguments_are_refused(RankContext& ctx) {
  CComm c(ctx, kTimeoutMs);
  const int ws = ctx.world_size;
  asynctp_symmetric* sym = nullptr;
  const auto t0 = std::chrono::steady_clock::now();
  const int rc = asynctp_symmetric_create(c.comm, ctx.rank == 0 ? 0 : 4096, 4, &sym);
  const std::string message = asynctp_last_error();
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  RANK_CHECK(rc == -1 && sym == nullptr, "a creation refused on rank 0 went through here");
  RANK_CHECK(contains(message, ctx.rank == 0 ? "bytes is 0; expected > 0" : "rank 0 refused"), message);
  RANK_CHECK(took < 5.0, "the refusal took ", took, " s");

  CSymmetric s(c, 4096, 4);
  void* p = nullptr;
  RANK_CHECK(asynctp_symmetric_peer(s.sym, ws, &p, nullptr) == -1, "rank ", ws, " was taken");
  RANK_CHECK(contains(asynctp_last_error(), "rank is " + std::to_string(ws)), asynctp_last_error());
  RANK_CHECK(asynctp_symmetric_put_signal(s.sym, 0, 4, 1, nullptr) == -1, "flag 4 of 4 was taken");
  RANK_CHECK(contains(asynctp_last_error(), "index is 4; expected 0 to 3"), asynctp_last_error());
  RANK_CHECK(asynctp_symmetric_wait_signal(s.sym, -1, 0, 1, nullptr) == -1, "owner -1 was taken");
  RANK_CHECK(contains(asynctp_last_error(), "owner is -1"), asynctp_last_error());
  RANK_CHECK(asynctp_symmetric_get_info(s.sym, nullptr) == -1, "a NULL info was taken");
  RANK_CHECK(contains(asynctp_last_error(), "info (the result) is NULL"), asynctp_last_error());
  RANK_CHECK(asynctp_comm_destroy(c.comm) == -1, "a communicator with symmetric memory was destroyed");
  RANK_CHECK(contains(asynctp_last_error(), "1 symmetric memory handle(s)"), asynctp_last_error());
  asynctp_symmetric* dead = s.sym;
  C_OK(asynctp_symmetric_destroy(s.sym));
  s.sym = nullptr;
  RANK_CHECK(asynctp_symmetric_destroy(dead) == -1, "a destroyed handle was destroyed again");
  RANK_CHECK(contains(asynctp_last_error(), "is not a live symmetric memory handle"), asynctp_last_error());
  RANK_CHECK(asynctp_symmetric_barrier(dead, nullptr) == -1, "a destroyed handle was used");
  return 0;
}

TEST(SymmetricApi, BadArgumentsAreRefusedByNameOnEveryRank) { RUN_EVERY_WORLD_SIZE(bad_arguments_are_refused); }

TEST(SymmetricApi, AWaitOnASignalNobodySendsEndsWithTheReport) {
  REQUIRE_GPUS(1);
  RUN_RANKS(1, [](RankContext& ctx) {
    CComm c(ctx, /*timeout_ms=*/1500);
    CSymmetric s(c, 4096, 8);
    Stream st;
    const auto t0 = std::chrono::steady_clock::now();
    C_OK(asynctp_symmetric_wait_signal(s.sym, 0, 5, 1, st.s));
    const int rc = asynctp_comm_synchronize(c.comm, st.s);
    const std::string message = asynctp_last_error();
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("after %.2f s: %s\n", took, message.c_str());
    RANK_CHECK(rc == -1, "the wait ended without an error");
    RANK_CHECK(contains(message, "a signal wait on rank 0 timed out after"), message);
    RANK_CHECK(contains(message, "flag 5 of rank 0 is 0, expected >= 1"), message);
    RANK_CHECK(took >= 1.4 && took < 10.0, "took ", took, " s");
    // The context is gone with the trap: the handles are left to the exiting process.
    s.sym = nullptr;
    c.comm = nullptr;
    return 0;
  });
}

}  // namespace
}  // namespace asynctp
