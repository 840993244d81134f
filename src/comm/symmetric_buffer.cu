#include <nccl_device.h>

#include <algorithm>

#include "comm/communicator_impl.h"
#include "common/check.h"

namespace asynctp {
namespace {

// NCCL 2.28 has no host-side getter for peer addresses (2.29 adds ncclGetLsaDevicePointer), but the
// device API computes them from the window; read once here, they serve both kernels and the copy engine.
__global__ void read_lsa_pointers(ncclWindow_t window, int lsa_size, void** out) {
  for (int peer = threadIdx.x; peer < lsa_size; peer += blockDim.x) out[peer] = ncclGetLsaPointer(window, 0, peer);
}

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

std::unique_ptr<SymmetricBuffer> SymmetricBuffer::create(Communicator& comm, size_t bytes) {
  ASYNCTP_CHECK(bytes > 0, "SymmetricBuffer::create: bytes must be > 0");
  Communicator::Impl& m = comm.impl();
  std::unique_ptr<SymmetricBuffer> buf(new SymmetricBuffer());
  buf->comm_ = &comm;
  buf->size_ = round_up(bytes, NCCL_WIN_REQUIRED_ALIGNMENT);
  ASYNCTP_CUDA_CHECK(cudaSetDevice(m.device));
  ASYNCTP_NCCL_CHECK(ncclMemAlloc(&buf->local_, buf->size_));
  // Zeroed before registration: the collective registration then orders every rank's zeroing before
  // any peer can use the memory.
  ASYNCTP_CUDA_CHECK(cudaMemsetAsync(buf->local_, 0, buf->size_, m.setup_stream));
  ASYNCTP_CUDA_CHECK(cudaStreamSynchronize(m.setup_stream));
  ASYNCTP_NCCL_CHECK(ncclCommWindowRegister(m.comm, buf->local_, buf->size_, &buf->window_, NCCL_WIN_COLL_SYMMETRIC));

  const int n = m.lsa.size;
  ASYNCTP_CUDA_CHECK(cudaMalloc(&buf->device_peers_, sizeof(void*) * n));
  read_lsa_pointers<<<1, 32, 0, m.setup_stream>>>(buf->window_, n, buf->device_peers_);
  ASYNCTP_CUDA_CHECK(cudaGetLastError());
  buf->peers_.resize(n);
  ASYNCTP_CUDA_CHECK(cudaMemcpyAsync(buf->peers_.data(), buf->device_peers_, sizeof(void*) * n,
                                     cudaMemcpyDeviceToHost, m.setup_stream));
  ASYNCTP_CUDA_CHECK(cudaStreamSynchronize(m.setup_stream));
  m.symmetric_buffers.push_back(buf.get());
  return buf;
}

SymmetricBuffer::~SymmetricBuffer() {
  Communicator::Impl& m = comm_->impl();
  auto& live = m.symmetric_buffers;
  live.erase(std::remove(live.begin(), live.end(), this), live.end());
  cudaSetDevice(m.device);
  if (cudaDeviceSynchronize() != cudaSuccess) return;  // the context is gone; see ~Communicator
  // No rank may free its part while a peer's work can still reach it: every rank has drained its own
  // GPU work (above); the all-gather below holds each rank until all have.
  try {
    (void)m.failing_ranks(true);
  } catch (const std::exception&) {
    return;
  }
  if (window_) ncclCommWindowDeregister(m.comm, window_);
  if (local_) ncclMemFree(local_);
  if (device_peers_) cudaFree(device_peers_);
}

void* SymmetricBuffer::peer(int lsa_rank) const {
  ASYNCTP_CHECK(lsa_rank >= 0 && lsa_rank < lsa_size(), "SymmetricBuffer::peer: lsa_rank must be in [0, ", lsa_size(),
                "), got ", lsa_rank);
  return peers_[lsa_rank];
}

}  // namespace asynctp

namespace asynctp {

const SymmetricBuffer* Communicator::Impl::find_symmetric(const void* p, size_t bytes) const {
  const auto* begin = static_cast<const char*>(p);
  for (const SymmetricBuffer* buf : symmetric_buffers) {
    const auto* local = static_cast<const char*>(buf->local());
    if (begin >= local && begin + bytes <= local + buf->size()) return buf;
  }
  return nullptr;
}

}  // namespace asynctp
