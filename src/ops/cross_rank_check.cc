#include "ops/cross_rank_check.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "comm/communicator_impl.h"
#include "common/check.h"

namespace asynctp::ops {

void agree_across_ranks(Communicator& comm, const char* op, const Signature& signature, const std::string& local_error,
                        cudaStream_t stream) {
  // Too many values to compare is this rank's refusal like any other: shared, so that no peer waits
  // (and refused under capture too, so that a call does not depend on being captured).
  std::string refusal = local_error;
  size_t n = signature.fields.size();
  if (n + 2 > static_cast<size_t>(kCheckSlots)) {
    if (refusal.empty()) {
      refusal = detail::cat(op, ": too many arguments to compare across ranks (", n, " values; at most ",
                            kCheckSlots - 2, "): pass fewer B");
    }
    n = 0;
  }
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  ASYNCTP_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) {
    if (!refusal.empty()) throw Error(refusal);
    return;
  }
  Communicator::Impl& m = impl_of(comm);
  int64_t mine[kCheckSlots] = {};
  mine[0] = refusal.empty() ? 1 : 0;
  mine[1] = static_cast<int64_t>(n);
  for (size_t i = 0; i < n; ++i) mine[2 + i] = signature.fields[i].second;
  const int64_t* all = nullptr;
  std::vector<int64_t> gathered;
  if (m.mailbox) {
    static_assert(HostMailbox::kSlots == kCheckSlots, "one record layout for both exchanges");
    try {
      all = m.mailbox->exchange(mine, ++m.check_seq, m.timeout_ms, op);
    } catch (const Error& e) {
      // The ranks' call counts no longer match, so no later check could pair them; nothing of the
      // transport's runs.
      m.abandon(e.what(), Communicator::Impl::TransportFate::kAbort);
      throw;
    }
  } else {
    const std::string bytes(reinterpret_cast<const char*>(mine), sizeof mine);
    const std::vector<std::string> parts = m.exchange(bytes, op);
    gathered.resize(static_cast<size_t>(m.world_size) * kCheckSlots);
    for (int r = 0; r < m.world_size; ++r) {
      std::memcpy(gathered.data() + static_cast<size_t>(r) * kCheckSlots, parts[r].data(), sizeof mine);
    }
    all = gathered.data();
  }

  if (!refusal.empty()) throw Error(refusal);
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
