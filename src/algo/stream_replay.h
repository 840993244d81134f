// Internal: replays of a fixed sequence of stream work, each captured once into a CUDA graph.
//
// The fused reduce-scatter's pushes (per destination and piece: wait for the staged count, copy into
// the peer's inbox, raise the peer's flag) are the same on every call of a shape: the counters are
// zeroed per call and the flag copies read the epoch when they run. Enqueued one by one they are
// 3 × pieces × (world − 1) API calls, microseconds of host time each, and on 4 GPUs the last of
// them reached the GPU after the kernel had staged its tiles (docs/fused_reduce_scatter.md); launched as a
// graph they are one call.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

namespace asynctp::algo {

class StreamReplay {
 public:
  StreamReplay() = default;
  ~StreamReplay();
  StreamReplay(const StreamReplay&) = delete;
  StreamReplay& operator=(const StreamReplay&) = delete;

  // The graph of the work `enqueue(origin)` enqueues for `key`: the first time for a key, `enqueue` is
  // called once under capture on a private stream (it may fork onto other streams, and must join them
  // back onto `origin`), and the graph it made is instantiated, uploaded on `stream` and kept. The key
  // must hold every value the work depends on (pointers, sizes): it is not enqueued again. Keeps at
  // most kMaxGraphs graphs, dropping the least recently used (one still running is freed when it ends).
  //
  // Call it before launching anything the graph's work must run beside: on 4 GPUs, cudaGraphInstantiate
  // did not return while a fused kernel on the same GPU waited for its peers, which waited for this
  // rank's pushes (FusedOps.ReduceScatterCases_MultiRank timed out).
  cudaGraphExec_t prepare(const std::vector<uint64_t>& key, cudaStream_t stream,
                          const std::function<void(cudaStream_t origin)>& enqueue);
  // Launches a graph prepare() returned, on `stream` (not under capture).
  static void launch(cudaGraphExec_t graph, cudaStream_t stream);

  size_t size() const { return graphs_.size(); }
  static constexpr size_t kMaxGraphs = 16;

 private:
  cudaStream_t capture_ = nullptr;
  // Most recently used last.
  std::vector<std::pair<std::vector<uint64_t>, cudaGraphExec_t>> graphs_;
};

}  // namespace asynctp::algo
