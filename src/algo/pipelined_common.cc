#include <algorithm>

#include "algo/pipelined.h"
#include "comm/communicator_impl.h"
#include "common/check.h"
#include "common/env.h"

namespace asynctp::algo {

bool one_node(const Communicator& comm) {
  const Communicator::Impl& m = impl_of(comm);
  bool numbered_as_world = m.lsa.size == m.world_size;
  for (int i = 0; numbered_as_world && i < m.lsa.size; ++i) numbered_as_world = comm.lsa_to_world(i) == i;
  return numbered_as_world;
}

void require_one_node(Communicator& comm, const char* op) {
  const Communicator::Impl& m = impl_of(comm);
  ASYNCTP_CHECK(one_node(comm), op, ": algorithm 'pipelined' needs every rank's GPU to reach every other's memory "
                "(one node); this communicator has ", m.world_size, " ranks but an NVLink/P2P (LSA) team of ",
                m.lsa.size, ": use 'sequential'");
}

int resolve_chunks(int requested, bool gather_last, int64_t rows) {
  const int chunks = requested > 0 ? requested : (gather_last ? 2 : 1);
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(chunks, rows)));
}

RsSum rs_sum_from_env() {
  switch (detail::knob_word(detail::Knob::kPipelinedRsSum)) {  // gemm|kernel
    case 0:
      return RsSum::kInGemm;
    case 1:
      return RsSum::kKernel;
    default:
      return RsSum::kDefault;
  }
}

RowRange chunk_rows(int64_t rows, int chunks, int i) { return {rows * i / chunks, rows * (i + 1) / chunks}; }

}  // namespace asynctp::algo
