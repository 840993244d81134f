// Internal: the transport for ranks that are threads of one process (asynctp/in_process.h), for tests
// and development on fewer GPUs than ranks. Symmetric memory is ordinary device memory whose peer
// pointers are the other ranks' allocations (peer access is enabled between the GPUs the group spans);
// exchanges go through the group's host memory; the collectives stage through symmetric memory between
// two barriers of the epoch-valued kind the kernels use, so they are bounded and capturable.
#pragma once

#include <memory>

#include "asynctp/in_process.h"
#include "comm/transport.h"
#include "kernels/wait_context.h"

namespace asynctp::comm {

// Rank `rank` of `group`, on the calling thread's device (which must be group->device_of(rank)).
// `ctx` bounds the collectives' waits; `timeout_ms` the exchanges.
std::unique_ptr<Transport> make_in_process_transport(std::shared_ptr<InProcessGroup> group, int rank, int timeout_ms,
                                                     const kernels::WaitContext& ctx);

}  // namespace asynctp::comm
