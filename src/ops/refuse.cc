#include "ops/refuse.h"

#include "asynctp/error.h"
#include "comm/communicator_impl.h"
#include "common/check.h"
#include "ops/cross_rank_check.h"

namespace asynctp::ops {

void refuse_call(Communicator& comm, const char* op, const std::string& why, cudaStream_t stream,
                 bool check_across_ranks) {
  const detail::RankScope scope(comm.rank());
  if (check_across_ranks) {
    // Ordered with this communicator's other calls, as the op would be; agree_across_ranks throws `why`.
    const Communicator::Impl::OrderedCall ordered(impl_of(comm), stream, op);
    agree_across_ranks(comm, op, Signature{}, why, stream);
  }
  throw Error(why);
}

}  // namespace asynctp::ops
