#include "ops/nonfinite.h"

#include <algorithm>
#include <climits>
#include <cstdint>

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

std::string describe_nonfinite(Communicator& comm, const char* op, const char* name, const TensorRef& t,
                               cudaStream_t stream) {
  Communicator::Impl& m = comm.impl();
  if (m.nonfinite_buf == nullptr) {
    ASYNCTP_CUDA_CHECK(cudaMalloc(&m.nonfinite_buf, 2 * sizeof(unsigned long long)));
    ASYNCTP_CUDA_CHECK(cudaMallocHost(&m.nonfinite_host, 2 * sizeof(unsigned long long)));
  }
  const uint16_t exponent = t.dtype == DType::kBF16 ? 0x7F80 : 0x7C00;
  const int64_t n = t.numel();
  m.nonfinite_host[0] = 0;
  m.nonfinite_host[1] = ULLONG_MAX;
  ASYNCTP_CUDA_CHECK(cudaMemcpyAsync(m.nonfinite_buf, m.nonfinite_host, 2 * sizeof(unsigned long long),
                                     cudaMemcpyHostToDevice, stream));
  constexpr int kThreads = 256;
  const int blocks = static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, 132 * 16));
  scan_nonfinite_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const uint16_t*>(t.data), n, exponent,
                                                         m.nonfinite_buf);
  ASYNCTP_CUDA_CHECK(cudaGetLastError());
  ASYNCTP_CUDA_CHECK(cudaMemcpyAsync(m.nonfinite_host, m.nonfinite_buf, 2 * sizeof(unsigned long long),
                                     cudaMemcpyDeviceToHost, stream));
  m.wait_bounded(stream, 2 * static_cast<int64_t>(m.timeout_ms), op);
  const unsigned long long count = m.nonfinite_host[0];
  if (count == 0) return {};
  const int64_t first = static_cast<int64_t>(m.nonfinite_host[1]);
  uint16_t bits = 0;
  ASYNCTP_CUDA_CHECK(cudaMemcpy(&bits, static_cast<const uint16_t*>(t.data) + first, sizeof bits,
                                cudaMemcpyDeviceToHost));
  const bool nan = (bits & static_cast<uint16_t>(~exponent & 0x7FFF)) != 0;
  const char* what = nan ? "nan" : (bits & 0x8000) ? "-inf" : "inf";
  return detail::with_rank(detail::cat(op, ": ASYNCTP_CHECK_NAN: ", name, " on rank ", m.rank, " holds ", count,
                                       " non-finite value(s) of ", n, "; the first is ", what, " at ", name,
                                       index_of(t, first)));
}

}  // namespace asynctp::ops
