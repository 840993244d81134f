// Internal: Algorithm::kAuto made concrete for one planned call, before the ranks agree on it (the
// agreement then compares the concrete choice, so ranks whose caches differ get an error, not a hang).
#pragma once

#include <string>

#include "algo/problem.h"
#include "asynctp/communicator.h"
#include "asynctp/ops.h"
#include "tune/choice.h"

namespace asynctp::tune {

// The problem a planned call solves on `world_size` GPUs of model `gpu`: what auto's choice is keyed by.
ProblemKey key_of(const algo::AllGatherMatmulPlan& plan, int world_size, const std::string& gpu);
ProblemKey key_of(const algo::MatmulReduceScatterPlan& plan, int world_size, const std::string& gpu);

// Whether the fused kernel takes a problem of this key (the pointers aside).
bool fused_kernel_applies(const ProblemKey& key);

// auto's choice for `key` on this communicator (its tuning cache, GPU model and world size).
Choice choose_for(const Communicator& comm, const ProblemKey& key);

// `options` with kAuto replaced by the choice for `key` (unchanged for other algorithms), remembered
// per communicator: the host time of a call is part of its cost. Across nodes, sequential. Throws an
// Error where the tuning cache cannot be read or parsed; the caller refuses the call with it through
// the agreement (thrown past it, it would leave the peers waiting for this rank until they time out).
OpOptions resolve(Communicator& comm, const ProblemKey& key, const OpOptions& options);

}  // namespace asynctp::tune
