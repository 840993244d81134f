// Internal: the transport of real use: an NCCL communicator (made or borrowed), NCCL symmetric windows,
// NCCL collectives, and a communicator split off for the host-side exchanges so that they never queue
// behind the data collectives.
#pragma once

#include <nccl.h>

#include <memory>

#include "comm/transport.h"

namespace asynctp::comm {

// `comm` is owned (destroyed or aborted here) when `owns`. `wait` bounds the exchanges' GPU work.
std::unique_ptr<Transport> make_nccl_transport(ncclComm_t comm, bool owns, BoundedWait wait);

}  // namespace asynctp::comm
