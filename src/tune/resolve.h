// Internal: Algorithm::kAuto made concrete for one call, before the call is validated or checked
// across ranks (the cross-rank check then compares the concrete choice, so ranks whose caches differ
// get an error, not a hang). Arguments too malformed to size the problem resolve to sequential, and
// validation then refuses them as it would any algorithm's.
#pragma once

#include <string>
#include <vector>

#include "asynctp/communicator.h"
#include "asynctp/ops.h"
#include "tune/choice.h"

namespace asynctp::tune {

// The problem `all_gather_matmul` / `matmul_reduce_scatter` would solve with these arguments on
// `world_size` GPUs of model `gpu`, or false where they are too malformed to tell (a size that does not
// fit in 64 bits among them).
bool all_gather_matmul_key(int world_size, const std::string& gpu, const TensorRef& a_shard,
                           const std::vector<TensorRef>& bs, int gather_dim, BLayout b_layout, ProblemKey& key);
bool matmul_reduce_scatter_key(int world_size, const std::string& gpu, const TensorRef& a, const TensorRef& b,
                               int scatter_dim, BLayout b_layout, ProblemKey& key);

// Whether `fused` runs its own kernel for the problem (else it runs pipelined underneath).
bool fused_kernel_applies(const ProblemKey& key);

// auto's choice for `key` on this communicator (its tuning cache, GPU model and world size).
Choice choose_for(const Communicator& comm, const ProblemKey& key);

// `options` with kAuto replaced by the choice for these arguments (unchanged for other algorithms).
// Where the choice fails (a tuning cache that cannot be read or parsed), sequential, with the error in
// `refusal` for the caller to refuse the call with through the cross-rank agreement: thrown here, it
// would leave the peers waiting for this rank until they time out.
OpOptions resolve_all_gather_matmul(Communicator& comm, const TensorRef& a_shard,
                                    const std::vector<TensorRef>& bs, int gather_dim, const OpOptions& options,
                                    std::string& refusal);
OpOptions resolve_matmul_reduce_scatter(Communicator& comm, const TensorRef& a, const TensorRef& b,
                                        int scatter_dim, const OpOptions& options, std::string& refusal);

}  // namespace asynctp::tune
