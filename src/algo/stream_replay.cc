#include "algo/stream_replay.h"

#include <algorithm>

#include "common/check.h"

namespace asynctp::algo {

StreamReplay::~StreamReplay() {
  // A graph still running is freed when it completes.
  for (auto& g : graphs_) cudaGraphExecDestroy(g.second);
  if (capture_ != nullptr) cudaStreamDestroy(capture_);
}

cudaGraphExec_t StreamReplay::find(const Key& key) {
  auto it = std::find_if(graphs_.begin(), graphs_.end(), [&](const auto& g) { return g.first == key; });
  if (it == graphs_.end()) return nullptr;
  std::rotate(it, it + 1, graphs_.end());
  return graphs_.back().second;
}

cudaGraphExec_t StreamReplay::prepare(const Key& key, cudaStream_t stream, const Enqueue& enqueue) {
  if (cudaGraphExec_t kept = find(key)) return kept;
  if (capture_ == nullptr) ASYNCTP_CUDA_CHECK(cudaStreamCreateWithFlags(&capture_, cudaStreamNonBlocking));
  // Thread-local: another thread's unrelated CUDA calls neither join this capture nor break it.
  ASYNCTP_CUDA_CHECK(cudaStreamBeginCapture(capture_, cudaStreamCaptureModeThreadLocal));
  cudaGraph_t graph = nullptr;
  try {
    enqueue(capture_);
  } catch (...) {
    // Leave no stream in capture: the next call must not find capture_ (or a forked stream) capturing.
    cudaStreamEndCapture(capture_, &graph);
    if (graph != nullptr) cudaGraphDestroy(graph);
    throw;
  }
  ASYNCTP_CUDA_CHECK(cudaStreamEndCapture(capture_, &graph));
  cudaGraphExec_t exec = nullptr;
  // Wait kernels go on high-priority streams so that they are placed before a GEMM's thread blocks
  // (overlap_resources.h); by default a graph's kernels would take the launch stream's priority.
  const cudaError_t made = cudaGraphInstantiateWithFlags(&exec, graph, cudaGraphInstantiateFlagUseNodePriority);
  cudaGraphDestroy(graph);
  ASYNCTP_CUDA_CHECK(made);
  const cudaError_t uploaded = cudaGraphUpload(exec, stream);
  if (uploaded != cudaSuccess) {
    cudaGraphExecDestroy(exec);
    ASYNCTP_CUDA_CHECK(uploaded);
  }
  if (graphs_.size() == kMaxGraphs) {
    cudaGraphExecDestroy(graphs_.front().second);  // freed when it completes, should it still run
    graphs_.erase(graphs_.begin());
    ++dropped_;
  }
  graphs_.emplace_back(key, exec);
  return exec;
}

cudaGraphExec_t StreamReplay::prepare_on_repeat(const Key& key, cudaStream_t stream, const Enqueue& enqueue) {
  if (cudaGraphExec_t kept = find(key)) return kept;
  if (dropped_ > kMaxGraphs) return nullptr;
  auto it = std::find(seen_.begin(), seen_.end(), key);
  if (it == seen_.end()) {
    if (seen_.size() == kMaxSeen) seen_.erase(seen_.begin());
    seen_.push_back(key);
    return nullptr;
  }
  seen_.erase(it);
  return prepare(key, stream, enqueue);
}

void StreamReplay::launch(cudaGraphExec_t graph, cudaStream_t stream) {
  ASYNCTP_CUDA_CHECK(cudaGraphLaunch(graph, stream));
}

}  // namespace asynctp::algo
