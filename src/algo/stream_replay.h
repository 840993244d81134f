// Internal: replays of a fixed sequence of stream work, each captured once into a CUDA graph.
//
// Enqueued one by one, an overlapped call's stream work is dozens of API calls, microseconds of host
// time each; a call often starts on an idle GPU, so that time is part of the call's. Launched as a graph
// it is one call. Two users: the fused reduce-scatter's pushes (per destination and chunk: wait for the
// staged count, copy into the peer's inbox, raise the peer's flag; on 4 GPUs, enqueued one by one, the
// last of them reached the GPU after the kernel had staged its tiles: docs/design/fused_matmul_reduce_scatter.md),
// and the whole of a pipelined call (docs/design/pipelined.md, "Repeated calls are graph replays").
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <type_traits>
#include <utility>
#include <vector>

namespace asynctp::algo {

// The first word of every key: which work the graph is of, so that keys of different users never match.
enum class ReplayKind : uint64_t { kFusedRsPushes = 0x5245504c00000001ull, kPipelinedAg, kPipelinedRs };

class StreamReplay {
 public:
  using Key = std::vector<uint64_t>;
  using Enqueue = std::function<void(cudaStream_t origin)>;

  // A key made of `work`, a plain struct compared whole (no padding: every byte is a value), then
  // `pointers` (one per peer, say) and `values` (one per B, say). Work recorded for it that reads only
  // these has every value it depends on in its key by construction.
  template <typename Work>
  static Key key_of(ReplayKind kind, const Work& work, const std::vector<const void*>& pointers,
                    const std::vector<int64_t>& values = {}) {
    static_assert(std::is_trivially_copyable_v<Work> && std::has_unique_object_representations_v<Work>,
                  "a replay key's struct must have no padding: it is compared byte for byte");
    Key key(1 + (sizeof(Work) + sizeof(uint64_t) - 1) / sizeof(uint64_t), 0);
    key[0] = static_cast<uint64_t>(kind);
    std::memcpy(key.data() + 1, &work, sizeof(Work));
    for (const void* p : pointers) key.push_back(reinterpret_cast<uintptr_t>(p));
    for (int64_t v : values) key.push_back(static_cast<uint64_t>(v));
    return key;
  }

  StreamReplay() = default;
  ~StreamReplay();
  StreamReplay(const StreamReplay&) = delete;
  StreamReplay& operator=(const StreamReplay&) = delete;

  // The graph of the work `enqueue(origin)` enqueues for `key`: the first time for a key, `enqueue` is
  // called once under capture on a private stream (it may fork onto other streams, and must join them
  // back onto `origin`), and the graph it made is instantiated (kernels keep the priority of the stream
  // they were captured from), uploaded on `stream` and kept. The key must hold every value the work
  // depends on (pointers, sizes): it is not enqueued again. Keeps at most kMaxGraphs graphs, dropping
  // the least recently used (one still running is freed when it ends).
  //
  // Call it before launching anything the graph's work must run beside: on 4 GPUs, cudaGraphInstantiate
  // did not return while a fused kernel on the same GPU waited for its peers, which waited for this
  // rank's pushes (FusedOps.ReduceScatterCases_MultiRank timed out).
  cudaGraphExec_t prepare(const Key& key, cudaStream_t stream, const Enqueue& enqueue);

  // As prepare(), for work the caller can also enqueue itself, which it must do where this returns
  // null: the first time `key` is seen (its first run also makes what the work allocates lazily, such
  // as cuBLASLt workspaces, which capture could not), and once more graphs have been dropped than are
  // kept (the caller cycles through more layouts than are kept, and recording each would cost far more
  // than enqueuing it).
  cudaGraphExec_t prepare_on_repeat(const Key& key, cudaStream_t stream, const Enqueue& enqueue);

  // Launches a graph prepare() returned, on `stream` (not under capture).
  static void launch(cudaGraphExec_t graph, cudaStream_t stream);

  size_t size() const { return graphs_.size(); }
  static constexpr size_t kMaxGraphs = 32;

 private:
  cudaGraphExec_t find(const Key& key);
  cudaStream_t capture_ = nullptr;
  // Most recently used last.
  std::vector<std::pair<Key, cudaGraphExec_t>> graphs_;
  // Keys prepare_on_repeat has seen once, most recent last (at most kMaxSeen).
  std::vector<Key> seen_;
  static constexpr size_t kMaxSeen = 4 * kMaxGraphs;
  size_t dropped_ = 0;
};

}  // namespace asynctp::algo
