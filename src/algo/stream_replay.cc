#include "algo/stream_replay.h"

#include <algorithm>

#include "common/check.h"

namespace asynctp::algo {

StreamReplay::~StreamReplay() {
  // A graph still running is freed when it completes.
  for (auto& g : graphs_) cudaGraphExecDestroy(g.second);
  if (capture_ != nullptr) cudaStreamDestroy(capture_);
}

cudaGraphExec_t StreamReplay::prepare(const std::vector<uint64_t>& key, cudaStream_t stream,
                                      const std::function<void(cudaStream_t origin)>& enqueue) {
  auto it = std::find_if(graphs_.begin(), graphs_.end(), [&](const auto& g) { return g.first == key; });
  if (it == graphs_.end()) {
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
    const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
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
    }
    graphs_.emplace_back(key, exec);
    it = graphs_.end() - 1;
  } else if (it + 1 != graphs_.end()) {
    std::rotate(it, it + 1, graphs_.end());
    it = graphs_.end() - 1;
  }
  return it->second;
}

void StreamReplay::launch(cudaGraphExec_t graph, cudaStream_t stream) {
  ASYNCTP_CUDA_CHECK(cudaGraphLaunch(graph, stream));
}

}  // namespace asynctp::algo
