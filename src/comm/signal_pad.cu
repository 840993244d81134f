#include <cuda.h>

#include "comm/communicator_impl.h"
#include "common/check.h"
#include "common/device_fault.h"
#include "common/driver_api.h"
#include "kernels/signal.cuh"

namespace asynctp {
namespace {

__global__ void wait_flag_kernel(const uint32_t* flag, uint32_t expected, int owner, int index,
                                 kernels::WaitContext ctx) {
  kernels::wait_flag_sys(flag, expected, owner, index, ctx);
}

}  // namespace

std::unique_ptr<SignalPad> SignalPad::create(Communicator& comm, int count) {
  const detail::RankScope scope(comm.rank());
  ASYNCTP_CHECK(count > 0, "SignalPad::create: count must be > 0, got ", count);
  std::unique_ptr<SignalPad> pad(new SignalPad());
  pad->comm_ = &comm;
  pad->count_ = count;
  pad->buffer_ = SymmetricBuffer::create(comm, sizeof(uint32_t) * static_cast<size_t>(count));
  return pad;
}

SignalPad::~SignalPad() = default;

uint32_t* SignalPad::local() const { return static_cast<uint32_t*>(buffer_->local()); }
uint32_t* SignalPad::peer(int lsa_rank) const { return static_cast<uint32_t*>(buffer_->peer(lsa_rank)); }
uint32_t* const* SignalPad::device_peers() const {
  return reinterpret_cast<uint32_t* const*>(buffer_->device_peers());
}

void SignalPad::check_flag(int owner, int index, const char* what) const {
  const detail::RankScope scope(comm_->rank());
  ASYNCTP_CHECK(owner >= 0 && owner < buffer_->lsa_size(), "SignalPad::", what, ": owner must be an LSA rank in [0, ",
                buffer_->lsa_size(), "), got ", owner);
  ASYNCTP_CHECK(index >= 0 && index < count_, "SignalPad::", what, ": index must be in [0, ", count_, "), got ", index);
}

void SignalPad::set(cudaStream_t stream, int owner, int index, uint32_t value) {
  check_flag(owner, index, "set");
  // The default flags keep the memory barrier that orders earlier work on the stream (copies
  // included) before the write.
  ASYNCTP_CU_CHECK(detail::driver().stream_write_value32(reinterpret_cast<CUstream>(stream),
                                                         reinterpret_cast<CUdeviceptr>(peer(owner) + index), value,
                                                         CU_STREAM_WRITE_VALUE_DEFAULT));
}

void SignalPad::wait(cudaStream_t stream, int owner, int index, uint32_t value, WaitMode mode) {
  check_flag(owner, index, "wait");
  uint32_t* flag = peer(owner) + index;
  if (mode == WaitMode::kStreamMemOp) {
    ASYNCTP_CU_CHECK(detail::driver().stream_wait_value32(reinterpret_cast<CUstream>(stream),
                                                          reinterpret_cast<CUdeviceptr>(flag), value,
                                                          CU_STREAM_WAIT_VALUE_GEQ));
    return;
  }
  const kernels::WaitContext ctx{impl_of(*comm_).fault, timeout_ns(*comm_), comm_->rank()};
  wait_flag_kernel<<<1, 1, 0, stream>>>(flag, value, comm_->lsa_to_world(owner), index, ctx);
  ASYNCTP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace asynctp
