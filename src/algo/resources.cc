#include "algo/resources.h"

#include "comm/communicator_impl.h"
#include "common/check.h"
#include "kernels/fused/tail_split.h"

namespace asynctp::algo {

Resources& Resources::of(Communicator& comm) {
  return impl_of(comm).attached<Resources>([&comm] { return std::make_unique<Resources>(comm); });
}

Resources::Resources(Communicator& comm) : comm_(comm) {
  Communicator::Impl& m = impl_of(comm);
  gemm.init(comm.cublaslt());
  if (m.transport->ranks_in_one_process() && m.world_size > 1) {
    Communicator::Impl* impl = &m;
    gemm.set_before_first_launch([impl] { impl->quiesce("a GEMM's first launch"); });
  }
}

void Resources::detach(bool healthy) {
  if (healthy) {
    overlap.reset();
    cudaFree(tail_split_);
  } else {
    (void)overlap.release();
  }
  tail_split_ = nullptr;
  gemm.reset(/*free_device_memory=*/healthy);  // plans go before the handle they were made with
}

void* Resources::tail_split_workspace(cudaStream_t stream) {
  if (tail_split_ != nullptr) return tail_split_;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  ASYNCTP_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) return nullptr;
  Communicator::Impl& m = impl_of(comm_);
  int sms = 0;
  ASYNCTP_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, m.device));
  const size_t bytes = kernels::fused::tail_split_workspace_bytes(sms);
  void* p = nullptr;
  ASYNCTP_CUDA_CHECK(cudaMalloc(&p, bytes));
  cudaError_t zeroed = cudaMemsetAsync(p, 0, bytes, m.setup_stream);
  if (zeroed == cudaSuccess) zeroed = cudaStreamSynchronize(m.setup_stream);
  if (zeroed != cudaSuccess) {
    cudaFree(p);
    ASYNCTP_CUDA_CHECK(zeroed);
  }
  tail_split_ = p;
  tail_split_sms_ = sms;
  return tail_split_;
}

}  // namespace asynctp::algo
