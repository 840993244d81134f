#include "ops/nonfinite.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <memory>

#include "comm/attachment.h"
#include "comm/communicator_impl.h"
#include "common/check.h"

namespace asynctp::ops {
namespace {

// bf16 and fp16 are both 16 bits wide; an element is not finite when its exponent bits are all ones.
__global__ void scan_nonfinite_kernel(const uint16_t* x, int64_t n, uint16_t exponent, unsigned long long* found) {
  unsigned long long count = 0, first = ULLONG_MAX;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    if ((x[i] & exponent) == exponent) {
      ++count;
      if (static_cast<unsigned long long>(i) < first) first = static_cast<unsigned long long>(i);
    }
  }
  if (count != 0) {
    atomicAdd(&found[0], count);
    atomicMin(&found[1], first);
  }
}

// The scan's buffers, kept on the communicator: {count, first index} per input, on the device and
// pinned on the host, for up to `inputs` inputs.
struct ScanBuffers final : comm::Attachment {
  unsigned long long* device = nullptr;
  unsigned long long* host = nullptr;
  size_t inputs = 0;
  void detach(bool healthy) override {
    if (healthy) {
      cudaFree(device);
      cudaFreeHost(host);
    }
  }
};

uint16_t exponent_bits(DType dtype) { return dtype == DType::kBF16 ? 0x7F80 : 0x7C00; }

std::string index_of(const TensorRef& t, int64_t flat) {
  int64_t idx[TensorRef::kMaxDims] = {};
  for (int d = t.ndim - 1; d >= 0; --d) {
    idx[d] = flat % t.shape[d];
    flat /= t.shape[d];
  }
  std::string s = "[";
  for (int d = 0; d < t.ndim; ++d) s += detail::cat(d ? ", " : "", idx[d]);
  return s + "]";
}

}  // namespace

std::string describe_nonfinite(Communicator& comm, const char* op, const NamedInputs& inputs, cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  ASYNCTP_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone || inputs.empty()) return {};
  Communicator::Impl& m = impl_of(comm);
  ScanBuffers& buf = m.attached<ScanBuffers>([] { return std::make_unique<ScanBuffers>(); });
  const size_t bytes = 2 * sizeof(unsigned long long) * inputs.size();
  if (buf.inputs < inputs.size()) {
    cudaFree(buf.device);  // waits for the device: the old buffer may still be in use
    cudaFreeHost(buf.host);
    buf.device = nullptr, buf.host = nullptr, buf.inputs = 0;
    ASYNCTP_CUDA_CHECK(cudaMalloc(&buf.device, bytes));
    ASYNCTP_CUDA_CHECK(cudaMallocHost(&buf.host, bytes));
    buf.inputs = inputs.size();
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    buf.host[2 * i] = 0;
    buf.host[2 * i + 1] = ULLONG_MAX;
  }
  ASYNCTP_CUDA_CHECK(cudaMemcpyAsync(buf.device, buf.host, bytes, cudaMemcpyHostToDevice, stream));
  constexpr int kThreads = 256;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const TensorRef& t = inputs[i].second;
    const int64_t n = t.numel();
    const int blocks = static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, 132 * 16));
    scan_nonfinite_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const uint16_t*>(t.data), n,
                                                           exponent_bits(t.dtype), buf.device + 2 * i);
    ASYNCTP_CUDA_CHECK(cudaGetLastError());
  }
  ASYNCTP_CUDA_CHECK(cudaMemcpyAsync(buf.host, buf.device, bytes, cudaMemcpyDeviceToHost, stream));
  m.wait_bounded(stream, 2 * static_cast<int64_t>(m.timeout_ms), op);
  for (size_t i = 0; i < inputs.size(); ++i) {
    const unsigned long long count = buf.host[2 * i];
    if (count == 0) continue;
    const auto& [name, t] = inputs[i];
    const int64_t first = static_cast<int64_t>(buf.host[2 * i + 1]);
    uint16_t bits = 0;
    ASYNCTP_CUDA_CHECK(cudaMemcpy(&bits, static_cast<const uint16_t*>(t.data) + first, sizeof bits,
                                  cudaMemcpyDeviceToHost));
    const bool nan = (bits & static_cast<uint16_t>(~exponent_bits(t.dtype) & 0x7FFF)) != 0;
    const char* what = nan ? "nan" : (bits & 0x8000) ? "-inf" : "inf";
    return detail::with_rank(detail::cat(op, ": ASYNCTP_CHECK_NAN: ", name, " on rank ", m.rank, " holds ", count,
                                         " non-finite value(s) of ", t.numel(), "; the first is ", what, " at ", name,
                                         index_of(t, first)));
  }
  return {};
}

}  // namespace asynctp::ops
