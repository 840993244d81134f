// Symmetric buffers: what each rank writes is read back correctly by every peer, through device peer
// pointers, NCCL's device API and host peer pointers (copy engine); create/destroy does not leak.
#include <nccl_device.h>

#include <vector>

#include "common/check.h"
#include "gpu_test.h"

namespace asynctp {
namespace {

using testing::make_comm;

__host__ __device__ uint32_t pattern(int rank, size_t i) {
  return static_cast<uint32_t>(i * 2654435761u) ^ (0x9E3779B9u * static_cast<uint32_t>(rank + 1));
}

__global__ void fill(uint32_t* p, size_t n, int rank) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = pattern(rank, i);
}

// Counts words of peer `lsa_peer` (world rank `owner`) that differ from its pattern, read through
// (a) the device_peers() array and (b) ncclGetLsaPointer on the window (the in-process transport has
// no window: (a) twice).
__global__ void count_wrong(void* const* peers, ncclWindow_t window, int lsa_peer, int owner, size_t n,
                            unsigned long long* wrong) {
  const auto* a = static_cast<const uint32_t*>(peers[lsa_peer]);
  const auto* b = window != nullptr ? static_cast<const uint32_t*>(ncclGetLsaPointer(window, 0, lsa_peer)) : a;
  unsigned long long bad = 0;
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    bad += (a[i] != pattern(owner, i)) + (b[i] != pattern(owner, i));
  }
  if (bad) atomicAdd(wrong, bad);
}

int read_every_peer(RankContext& ctx) {
  auto comm = make_comm(ctx);
  // An odd size: not a multiple of the window alignment, so rounding is exercised too.
  const size_t words = (3u << 20) + 17;
  auto buf = SymmetricBuffer::create(*comm, words * sizeof(uint32_t));
  RANK_CHECK(buf->size() >= words * sizeof(uint32_t), "size ", buf->size());
  RANK_CHECK(buf->lsa_size() == ctx.world_size, "lsa_size ", buf->lsa_size());
  cudaStream_t s;
  RANK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  fill<<<264, 256, 0, s>>>(static_cast<uint32_t*>(buf->local()), words, ctx.rank);
  comm->barrier(s);

  unsigned long long* wrong;
  RANK_CUDA(cudaMalloc(&wrong, sizeof *wrong));
  uint32_t* pulled;
  RANK_CUDA(cudaMalloc(&pulled, words * sizeof(uint32_t)));
  std::vector<uint32_t> host(words);
  for (int p = 0; p < buf->lsa_size(); ++p) {
    const int owner = comm->lsa_to_world(p);
    RANK_CUDA(cudaMemsetAsync(wrong, 0, sizeof *wrong, s));
    count_wrong<<<264, 256, 0, s>>>(buf->device_peers(), buf->window(), p, owner, words, wrong);
    unsigned long long bad = 1;
    RANK_CUDA(cudaMemcpyAsync(&bad, wrong, sizeof bad, cudaMemcpyDeviceToHost, s));
    // Copy engine, through the host-side peer pointer.
    RANK_CUDA(cudaMemsetAsync(pulled, 0, words * sizeof(uint32_t), s));
    RANK_CUDA(cudaMemcpyAsync(pulled, buf->peer(p), words * sizeof(uint32_t), cudaMemcpyDeviceToDevice, s));
    RANK_CUDA(cudaMemcpyAsync(host.data(), pulled, words * sizeof(uint32_t), cudaMemcpyDeviceToHost, s));
    comm->synchronize(s);
    RANK_CHECK(bad == 0, bad, " words of rank ", owner, " read wrong by a kernel");
    for (size_t i = 0; i < words; ++i) {
      RANK_CHECK(host[i] == pattern(owner, i), "copy-engine pull from rank ", owner, ": word ", i, " is ", host[i],
                 ", expected ", pattern(owner, i));
    }
  }
  comm->barrier(s);  // nobody frees while a peer still reads
  comm->synchronize(s);
  RANK_CUDA(cudaFree(pulled));
  RANK_CUDA(cudaFree(wrong));
  RANK_CUDA(cudaStreamDestroy(s));
  return 0;
}

TEST(SymmetricBuffer, EveryRankReadsEveryPeer_1Rank) {
  REQUIRE_GPUS(1);
  RUN_RANKS(1, read_every_peer);
}

TEST(SymmetricBuffer, EveryRankReadsEveryPeer_MultiRank) {
  RUN_EVERY_WORLD_SIZE(read_every_peer);
}

TEST(SymmetricBuffer, ThousandCreateDestroyCyclesLeaveMemoryWhereItWas) {
  REQUIRE_GPUS(2);
  RUN_RANKS(2, [](RankContext& ctx) {
    auto comm = make_comm(ctx);
    SymmetricBuffer::create(*comm, 8u << 20).reset();  // first use: NCCL's own one-time set-up
    size_t free_before = 0, free_after = 0, total = 0;
    // The device's free memory, read while no rank of this process allocates (in-process ranks share
    // the device).
    auto free_memory = [&](size_t* free) {
      ctx.allgather("quiet");
      RANK_CUDA(cudaDeviceSynchronize());
      RANK_CUDA(cudaMemGetInfo(free, &total));
      ctx.allgather("read");
    };
    free_memory(&free_before);
    for (int i = 0; i < 1000; ++i) {
      auto buf = SymmetricBuffer::create(*comm, (8u << 20) + static_cast<size_t>(i % 7) * 4096);
      RANK_CHECK(buf->peer(0) != nullptr, "cycle ", i);
    }
    free_memory(&free_after);
    const long long drift = static_cast<long long>(free_before) - static_cast<long long>(free_after);
    std::printf("rank %d: free GPU memory before %zu, after 1000 cycles %zu (drift %lld bytes)\n", ctx.rank,
                free_before, free_after, drift);
    // A leak of one 8 MiB buffer per cycle would show as 8 GB; 2 MiB is one allocation granule.
    RANK_CHECK(drift <= (2ll << 20), "free memory dropped by ", drift, " bytes over 1000 cycles");
    return 0;
  });
}

TEST(SymmetricBuffer, WorkspaceGrowsOnDemandAndIsReused) {
  REQUIRE_GPUS(2);
  RUN_RANKS(2, [](RankContext& ctx) {
    auto comm = make_comm(ctx);
    SymmetricBuffer& a = comm->workspace(1 << 20);
    void* first = a.local();
    SymmetricBuffer& b = comm->workspace(1000);  // fits: the same buffer
    RANK_CHECK(b.local() == first && b.size() >= (1u << 20), "workspace was reallocated for a smaller request");
    SymmetricBuffer& c = comm->workspace(5u << 20);
    RANK_CHECK(c.size() >= (5u << 20), "workspace size ", c.size());
    return 0;
  });
}

TEST(SymmetricBuffer, BadArgumentsAreRefused) {
  REQUIRE_GPUS(1);
  RUN_RANKS(1, [](RankContext& ctx) {
    auto comm = make_comm(ctx);
    try {
      SymmetricBuffer::create(*comm, 0);
      RANK_CHECK(false, "no error for 0 bytes");
    } catch (const Error& e) {
      RANK_CHECK(std::string(e.what()).find("bytes must be > 0") != std::string::npos, e.what());
    }
    auto buf = SymmetricBuffer::create(*comm, 4096);
    try {
      buf->peer(1);
      RANK_CHECK(false, "no error for peer 1 of 1");
    } catch (const Error& e) {
      RANK_CHECK(std::string(e.what()).find("lsa_rank must be in [0, 1), got 1") != std::string::npos, e.what());
    }
    comm->require_hopper("this test");  // the GPU machines are H100/H200
    return 0;
  });
}

}  // namespace
}  // namespace asynctp
