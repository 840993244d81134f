// The transports (comm/transport.h), each test on NCCL where every rank has a GPU and in-process where
// not: peers write each other's symmetric memory through both kinds of peer pointer; the sequential
// algorithm's collectives match a host reference at odd sizes. And the in-process launcher's promises:
// a rank that throws or hangs is named, and the others' waits end in bounded time.
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "asynctp/in_process.h"
#include "comm/communicator_impl.h"
#include "common/check.h"
#include "gpu_test.h"
#include "ops_problems.h"

namespace asynctp {
namespace {

using testing::make_comm;

__host__ __device__ uint32_t word(int writer, int reader, size_t i) {
  return static_cast<uint32_t>(i * 2246822519u) ^ (0x9E3779B9u * static_cast<uint32_t>(writer * 31 + reader + 1));
}

// Writes rank `me`'s words into slot `me` of every peer's buffer through the device peer pointers.
__global__ void write_peers(void* const* peers, int n, int me, size_t words) {
  for (int q = 0; q < n; ++q) {
    auto* slot = static_cast<uint32_t*>(peers[q]) + static_cast<size_t>(me) * words;
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < words; i += gridDim.x * blockDim.x) {
      slot[i] = word(me, q, i);
    }
  }
}

int peers_write_each_other(RankContext& ctx) {
  auto comm = make_comm(ctx);
  const int n = ctx.world_size;
  const size_t words = 100003;  // odd: not a multiple of any alignment
  // Two regions: slot r of the first written by rank r's kernel, of the second by its copy engine.
  auto buf = SymmetricBuffer::create(*comm, 2 * n * words * sizeof(uint32_t));
  cudaStream_t s;
  RANK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  write_peers<<<132, 256, 0, s>>>(buf->device_peers(), n, ctx.rank, words);
  RANK_CUDA(cudaGetLastError());
  std::vector<uint32_t> mine(words);
  for (int q = 0; q < n; ++q) {
    for (size_t i = 0; i < words; ++i) mine[i] = word(ctx.rank, q, i);
    auto* slot = static_cast<char*>(buf->peer(q)) + (static_cast<size_t>(n) + ctx.rank) * words * sizeof(uint32_t);
    RANK_CUDA(cudaMemcpyAsync(slot, mine.data(), words * sizeof(uint32_t), cudaMemcpyHostToDevice, s));
    RANK_CUDA(cudaStreamSynchronize(s));  // `mine` is reused
  }
  comm->barrier(s);
  std::vector<uint32_t> got(2 * n * words);
  RANK_CUDA(cudaMemcpyAsync(got.data(), buf->local(), got.size() * sizeof(uint32_t), cudaMemcpyDeviceToHost, s));
  comm->synchronize(s);
  for (int region = 0; region < 2; ++region) {
    for (int w = 0; w < n; ++w) {
      for (size_t i = 0; i < words; ++i) {
        const uint32_t v = got[(static_cast<size_t>(region) * n + w) * words + i];
        RANK_CHECK(v == word(w, ctx.rank, i), region == 0 ? "kernel" : "copy-engine", " write of rank ", w,
                   ": word ", i, " is ", v, ", expected ", word(w, ctx.rank, i));
      }
    }
  }
  comm->barrier(s);
  comm->synchronize(s);
  RANK_CUDA(cudaStreamDestroy(s));
  std::printf("rank %d (%s): %d peers' writes right through both pointer kinds\n", ctx.rank, comm->transport_name(), n);
  return 0;
}

TEST(Transport, PeersWriteEachOthersMemoryThroughBothPointerKinds) {
  RUN_EVERY_WORLD_SIZE(peers_write_each_other);
}

// Exact in bf16 and fp16, and so are their sums over a few ranks.
float value(int rank, size_t i) { return static_cast<float>(static_cast<int>((i * 7 + rank * 13) % 33) - 16) / 8.0f; }

template <typename T>
T to_t(float v);
template <>
__nv_bfloat16 to_t(float v) { return __float2bfloat16(v); }
template <>
__half to_t(float v) { return __float2half(v); }
float from_t(__nv_bfloat16 v) { return __bfloat162float(v); }
float from_t(__half v) { return __half2float(v); }

template <typename T>
void check_reduce_scatter(Communicator& comm, DType dtype, size_t count, ReduceOp op, cudaStream_t s) {
  const int n = comm.world_size();
  std::vector<T> send(n * count);
  for (size_t i = 0; i < send.size(); ++i) send[i] = to_t<T>(value(comm.rank(), i));
  T *d_send, *d_recv;
  RANK_CUDA(cudaMallocAsync(&d_send, send.size() * sizeof(T), s));  // stream-ordered: see ops_test_cases.h's Buf
  RANK_CUDA(cudaMallocAsync(&d_recv, count * sizeof(T), s));
  RANK_CUDA(cudaMemcpyAsync(d_send, send.data(), send.size() * sizeof(T), cudaMemcpyHostToDevice, s));
  RANK_CUDA(cudaMemsetAsync(d_recv, 0xFF, count * sizeof(T), s));
  impl_of(comm).transport->reduce_scatter(d_send, d_recv, count, dtype, op, s);
  comm.synchronize(s);  // bounded; the copy into pageable memory below would wait for the collective unbounded
  std::vector<T> got(count);
  RANK_CUDA(cudaMemcpy(got.data(), d_recv, count * sizeof(T), cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < count; ++i) {
    double sum = 0;
    for (int q = 0; q < n; ++q) sum += value(q, comm.rank() * count + i);
    const double expect = op == ReduceOp::kAvg ? sum / n : sum;
    // Sums of these values are exact; an average rounds once (NCCL's sums in the input type round more).
    const double tolerance = op == ReduceOp::kAvg ? std::abs(expect) / 64 + 1e-3 : 1e-6;
    RANK_CHECK(std::abs(from_t(got[i]) - expect) <= tolerance, "reduce-scatter of ", count, " ", dtype_name(dtype),
               op == ReduceOp::kAvg ? " (avg)" : " (sum)", ": element ", i, " is ", from_t(got[i]), ", expected ",
               expect);
  }
  RANK_CUDA(cudaFreeAsync(d_send, s));
  RANK_CUDA(cudaFreeAsync(d_recv, s));
}

int collectives_match_the_host(RankContext& ctx) {
  auto comm = make_comm(ctx);
  const int n = ctx.world_size;
  cudaStream_t s;
  RANK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (size_t bytes : {size_t{1}, size_t{7}, size_t{4099}, (size_t{1} << 20) + 3}) {
    std::vector<unsigned char> mine(bytes);
    for (size_t i = 0; i < bytes; ++i) mine[i] = static_cast<unsigned char>(i * 31 + ctx.rank * 101 + 7);
    unsigned char *d_send, *d_recv;
    RANK_CUDA(cudaMallocAsync(&d_send, bytes, s));
    RANK_CUDA(cudaMallocAsync(&d_recv, bytes * n, s));
    RANK_CUDA(cudaMemcpyAsync(d_send, mine.data(), bytes, cudaMemcpyHostToDevice, s));
    RANK_CUDA(cudaMemsetAsync(d_recv, 0, bytes * n, s));
    impl_of(*comm).transport->all_gather(d_send, d_recv, bytes, s);
    comm->synchronize(s);  // bounded, as in check_reduce_scatter
    std::vector<unsigned char> all(bytes * n);
    RANK_CUDA(cudaMemcpy(all.data(), d_recv, all.size(), cudaMemcpyDeviceToHost));
    for (int q = 0; q < n; ++q) {
      for (size_t i = 0; i < bytes; ++i) {
        const auto expect = static_cast<unsigned char>(i * 31 + q * 101 + 7);
        RANK_CHECK(all[q * bytes + i] == expect, "all-gather of ", bytes, " bytes: rank ", q, "'s byte ", i, " is ",
                   int(all[q * bytes + i]), ", expected ", int(expect));
      }
    }
    RANK_CUDA(cudaFreeAsync(d_send, s));
    RANK_CUDA(cudaFreeAsync(d_recv, s));
  }
  for (size_t count : {size_t{1}, size_t{5}, size_t{1003}, size_t{65537}}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      check_reduce_scatter<__nv_bfloat16>(*comm, DType::kBF16, count, op, s);
      check_reduce_scatter<__half>(*comm, DType::kFP16, count, op, s);
    }
  }
  RANK_CUDA(cudaStreamDestroy(s));
  std::printf("rank %d (%s): all-gather and reduce-scatter right at odd sizes\n", ctx.rank, comm->transport_name());
  return 0;
}

TEST(Transport, CollectivesMatchAHostReferenceAtOddSizes) {
  RUN_EVERY_WORLD_SIZE(collectives_match_the_host);
}

TEST(Transport, CollectivesMatchAHostReferenceAtOddSizes_1Rank) {
  REQUIRE_GPUS(1);
  RUN_RANKS(1, collectives_match_the_host);
}

// The SM budget: resolved to whole 2-SM clusters within the GPU; by default the whole GPU for one rank
// and an equal share, less 2 SMs a rank, where in-process ranks share it; fewer than 2 refused by name.
// The fused ops stay right on a budget far below the GPU's (the persistent loop covers the tiles with
// fewer CTAs), and at every world size on one GPU they run at all only because every rank's kernel
// fits in its share.
// A further communicator of the launch's ranks with `o`: in-process from the group, on NCCL from a
// fresh unique id (one id makes one NCCL communicator).
std::unique_ptr<Communicator> another_comm(RankContext& ctx, CommunicatorOptions o) {
  if (ctx.group) return Communicator::create(ctx, o);
  ncclUniqueId id{};
  if (ctx.rank == 0) RANK_CHECK(ncclGetUniqueId(&id) == ncclSuccess, "ncclGetUniqueId failed");
  const std::vector<std::string> all = ctx.allgather(std::string(reinterpret_cast<const char*>(&id), sizeof id));
  std::memcpy(&id, all[0].data(), sizeof id);
  o.device = ctx.device;
  return Communicator::create(ctx.rank, ctx.world_size, id, o);
}

int sm_budget_is_honoured(RankContext& ctx) {
  int sms = 0;
  RANK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx.device));
  const int sharing = ctx.group ? ctx.group->ranks_on_device(ctx.device) : 1;
  {
    auto comm = make_comm(ctx);
    const int share = sharing == 1 ? sms : (sms - 2 * sharing) / sharing;
    const int expect = share - share % 2;
    RANK_CHECK(comm->sm_budget() == expect, "default sm_budget ", comm->sm_budget(), ", expected ", expect, " (", sms,
               " SMs, ", sharing, " rank(s) on the GPU)");
  }
  CommunicatorOptions o;
  o.timeout_ms = 0;
  o.sm_budget = 13;
  auto comm = another_comm(ctx, o);
  RANK_CHECK(comm->sm_budget() == 12, "sm_budget 13 resolved to ", comm->sm_budget(), ", expected 12");
  testing::Stream st;
  reference::Fp32Gemm fp32;
  const int ws = ctx.world_size;
  OpOptions fused;
  fused.algorithm = Algorithm::kFused;
  testing::run_ag_case(*comm, testing::AgCase{{1024 * ws, 512}, 768, false, false, false, 1, DType::kBF16}, st.s, fp32,
                       fused);
  testing::run_rs_case(*comm, testing::RsCase{1024 * ws, 768, 256 * ws, false, false, ReduceOp::kSum, DType::kBF16, false},
                       st.s, fp32, fused);
  comm->synchronize(st.s);
  std::string refused;
  o.sm_budget = 1;
  try {
    (void)another_comm(ctx, o);
  } catch (const Error& e) {
    refused = e.what();
  }
  RANK_CHECK(testing::contains(refused, "sm_budget"), "sm_budget 1 was not refused by name: '", refused, "'");
  std::printf("rank %d (%s): sm_budget defaults to %d of %d SMs; fused ops right on 12\n", ctx.rank,
              comm->transport_name(), comm->sm_budget(), sms);
  return 0;
}

TEST(Transport, SmBudgetIsResolvedAndTheFusedOpsStayRightOnIt_1Rank) {
  REQUIRE_GPUS(1);
  RUN_RANKS(1, sm_budget_is_honoured);
}

TEST(Transport, SmBudgetIsResolvedAndTheFusedOpsStayRightOnIt_MultiRank) {
  RUN_EVERY_WORLD_SIZE(sm_budget_is_honoured);
}

// In-process: a rank that throws instead of taking part ends the others' waits with an error that
// names it, well within the timeout, and the launcher names it too.
TEST(InProcess, ARankThatThrowsIsNamedAndTheOthersWaitsEnd) {
  REQUIRE_GPUS(1);
  LaunchOptions o = testing::test_launch_options();
  o.in_process = true;
  const auto start = std::chrono::steady_clock::now();
  const LaunchResult r = launch(3, [](RankContext& ctx) {
    if (ctx.rank == 1) throw std::runtime_error("rank 1: thrown on purpose, before its communicator");
    const auto t0 = std::chrono::steady_clock::now();
    try {
      auto comm = make_comm(ctx, /*timeout_ms=*/20000);  // collective: rank 1 never comes
    } catch (const Error& e) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const std::string what = e.what();
      RANK_CHECK(what.find("aborted") != std::string::npos && what.find("rank 1") != std::string::npos,
                 "the error does not say that rank 1 failed: ", what);
      RANK_CHECK(s < 10, "the wait ended after ", s, " s; expected well within the 20 s timeout");
      std::printf("rank %d: ended after %.3f s: %s\n", ctx.rank, s, what.c_str());
      return 0;
    }
    RANK_CHECK(false, "the communicator was made although rank 1 never took part");
    return 1;
  }, o);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_FALSE(r.ok);
  EXPECT_EQ(r.failed_rank, 1) << r.message;
  EXPECT_NE(r.message.find("thrown on purpose"), std::string::npos) << r.message;
  ASSERT_EQ(r.ranks.size(), 3u);
  EXPECT_EQ(r.ranks[0].exit_code, 0) << "rank 0 did not see its wait end with the error";
  EXPECT_EQ(r.ranks[2].exit_code, 0) << "rank 2 did not see its wait end with the error";
  EXPECT_EQ(r.ranks[1].exit_code, 1);
  EXPECT_LT(s, 60.0);
}

// In-process ranks that share a GPU under lazy kernel loading are refused by name on every rank when
// their communicators are made, not left to time out at a first fused call (docs/design/transport.md).
TEST(InProcess, RanksThatShareAGpuUnderLazyLoadingAreRefused) {
  REQUIRE_GPUS(1);
  std::string why;
  if (testing::visible_gpus(&why) > 1) GTEST_SKIP() << "in-process ranks share a GPU here only where one is visible";
  const testing::ScopedEnv lazy("CUDA_MODULE_LOADING", "LAZY");  // the launcher keeps a value that is set
  LaunchOptions o = testing::test_launch_options();
  o.in_process = true;
  const LaunchResult r = launch(2, [](RankContext& ctx) {
    try {
      auto comm = make_comm(ctx);
    } catch (const Error& e) {
      const std::string what = e.what();
      RANK_CHECK(what.find("share GPU") != std::string::npos && what.find("CUDA_MODULE_LOADING=EAGER") != std::string::npos,
                 "the error does not say why or what to set: ", what);
      std::printf("rank %d: %s\n", ctx.rank, what.c_str());
      return 0;
    }
    RANK_CHECK(false, "a communicator was made for ranks that share a GPU under lazy loading");
    return 1;
  }, o);
  EXPECT_TRUE(r.ok) << r.message;
}

// In-process: a rank that never returns is named once the launch's time is up, and launch() returns.
TEST(InProcess, ARankThatHangsIsNamedAndTheLaunchEnds) {
  REQUIRE_GPUS(1);
  LaunchOptions o = testing::test_launch_options();
  o.in_process = true;
  o.timeout_ms = 15000;
  const auto start = std::chrono::steady_clock::now();
  const LaunchResult r = launch(2, [](RankContext& ctx) {
    auto comm = make_comm(ctx, /*timeout_ms=*/60000);
    if (ctx.rank == 1) std::this_thread::sleep_for(std::chrono::minutes(10));
    try {
      (void)comm->all_ok(true);  // rank 1 never comes; the launcher's deadline aborts the group
    } catch (const Error&) {
      return 0;
    }
    return 1;
  }, o);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_FALSE(r.ok);
  EXPECT_EQ(r.failed_rank, 1) << r.message;
  EXPECT_NE(r.message.find("did not return"), std::string::npos) << r.message;
  EXPECT_LT(s, 30.0) << r.message;
}

}  // namespace
}  // namespace asynctp
