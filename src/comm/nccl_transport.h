// Internal: the transport of real use: an NCCL communicator (made or borrowed), NCCL symmetric windows,
// NCCL collectives, and a communicator split off for the host-side exchanges so that they never queue
// behind the data collectives.
#pragma once

#include <nccl.h>

#include <memory>

#include "comm/transport.h"

namespace asynctp::comm {

// `comm` is owned (destroyed or aborted here) when `owns`. `wait` bounds the exchanges' GPU work;
// setup_bound_ms NCCL's collective set-up calls (split, device communicator, window registration),
// which throw comm::SetupStuck past it (comm/bounded_call.h).
std::unique_ptr<Transport> make_nccl_transport(ncclComm_t comm, bool owns, BoundedWait wait, int setup_bound_ms);

}  // namespace asynctp::comm
