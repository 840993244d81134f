// Internal: what the algorithms keep per communicator (a comm::Attachment): the cuBLASLt GEMM runner
// with its cached plans and workspaces, the overlapped algorithms' streams, flags and inbox
// (OverlapResources, made by the first pipelined or fused call) and the fused GEMM's split-K workspace.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>

#include "algo/overlap_resources.h"
#include "asynctp/communicator.h"
#include "comm/attachment.h"
#include "gemm/cublaslt_gemm.h"

namespace asynctp::algo {

class Resources final : public comm::Attachment {
 public:
  // `comm`'s, made on first use. Where its ranks are threads of one process, the GEMM runner quiesces
  // every rank before a GEMM's first launch (Communicator::Impl::quiesce).
  static Resources& of(Communicator& comm);

  explicit Resources(Communicator& comm);
  void detach(bool healthy) override;

  gemm::GemmRunner gemm;

  // The overlapped algorithms' resources, made on first use (OverlapResources::of).
  std::unique_ptr<OverlapResources> overlap;

  // The fused GEMM's workspace for splitting its last round of tiles (kernels/fused/tail_split.h),
  // allocated (counters zeroed) on first use; null where that first use is being captured into a CUDA
  // graph, which allocates nothing (the kernel then computes every tile whole).
  void* tail_split_workspace(cudaStream_t stream);
  int tail_split_sms() const { return tail_split_sms_; }

 private:
  Communicator& comm_;
  void* tail_split_ = nullptr;
  int tail_split_sms_ = 0;
};

}  // namespace asynctp::algo
