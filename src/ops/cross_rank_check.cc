#include "ops/cross_rank_check.h"

#include <algorithm>

#include "comm/communicator_impl.h"
#include "common/check.h"

namespace asynctp::ops {

void agree_across_ranks(Communicator& comm, const char* op, const Signature& signature, const std::string& local_error,
                        cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  ASYNCTP_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) {
    if (!local_error.empty()) throw Error(local_error);
    return;
  }
  Communicator::Impl& m = comm.impl();
  const size_t n = signature.fields.size();
  ASYNCTP_CHECK(n + 2 <= static_cast<size_t>(kCheckSlots), op, ": too many arguments to compare across ranks (", n,
                " values; at most ", kCheckSlots - 2, "): pass fewer B");
  int64_t* mine = m.check_host;  // pinned: the copies below are plain DMA, no staging
  std::fill(mine, mine + kCheckSlots, 0);
  mine[0] = local_error.empty() ? 1 : 0;
  mine[1] = static_cast<int64_t>(n);
  for (size_t i = 0; i < n; ++i) mine[2 + i] = signature.fields[i].second;
  const int64_t* all = nullptr;
  if (m.mailbox) {
    static_assert(HostMailbox::kSlots == kCheckSlots, "one record layout for both exchanges");
    try {
      all = m.mailbox->exchange(mine, ++m.check_seq, m.timeout_ms, op);
    } catch (const Error& e) {
      // The ranks' call counts no longer match, so no later check could pair them; nothing of NCCL's runs.
      m.abandon(e.what(), Communicator::Impl::NcclFate::kAbort);
      throw;
    }
  } else {
    int64_t* slot = m.check_buf + static_cast<size_t>(m.rank) * kCheckSlots;
    int64_t* gathered = m.check_host + kCheckSlots;
    ASYNCTP_CUDA_CHECK(cudaMemcpyAsync(slot, mine, sizeof(int64_t) * kCheckSlots, cudaMemcpyHostToDevice,
                                       m.check_stream));
    ASYNCTP_NCCL_CHECK(ncclAllGather(slot, m.check_buf, kCheckSlots, ncclInt64, m.check_comm, m.check_stream));
    ASYNCTP_CUDA_CHECK(cudaMemcpyAsync(gathered, m.check_buf, sizeof(int64_t) * kCheckSlots * m.world_size,
                                       cudaMemcpyDeviceToHost, m.check_stream));
    m.wait_bounded(m.check_stream, m.timeout_ms, op);
    all = gathered;
  }

  if (!local_error.empty()) throw Error(local_error);
  for (int r = 0; r < m.world_size; ++r) {
    if (all[static_cast<size_t>(r) * kCheckSlots] == 0) {
      detail::raise(detail::cat(op, ": rank ", r, " refused its arguments (its own error says why), so no rank ran ",
                                op));
    }
  }
  for (int r = 0; r < m.world_size; ++r) {
    const int64_t* theirs = all + static_cast<size_t>(r) * kCheckSlots;
    if (theirs[1] != static_cast<int64_t>(n)) {
      detail::raise(detail::cat(op, ": ranks disagree on the number of arguments: rank ", r, " passed ",
                                theirs[1], " values, this rank ", n,
                                " (different numbers of B?); every rank must make the same call"));
    }
    for (size_t i = 0; i < n; ++i) {
      if (theirs[2 + i] != mine[2 + i]) {
        detail::raise(detail::cat(op, ": ranks disagree on ", signature.fields[i].first, ": rank ", r, " has ",
                                  theirs[2 + i], ", this rank ", mine[2 + i],
                                  "; every rank must pass the same shapes, dtype and options"));
      }
    }
  }
}

}  // namespace asynctp::ops
