#include "tune/resolve.h"

#include <array>
#include <map>
#include <memory>
#include <utility>

#include "algo/fused.h"
#include "algo/pipelined.h"
#include "asynctp/error.h"
#include "asynctp/version.h"
#include "comm/attachment.h"
#include "comm/communicator_impl.h"

namespace asynctp::tune {

ProblemKey key_of(const algo::AllGatherMatmulPlan& plan, int world_size, const std::string& gpu) {
  ProblemKey key;
  key.op = Op::kAllGatherMatmul;
  key.M = plan.M;
  key.K = plan.K;
  for (int64_t n : plan.N) key.N += n;  // several Bs: one GEMM's worth of work each, one gather for all
  key.dtype = plan.dtype;
  key.last_dim = plan.gather_last;
  key.fused_kernel = !plan.scaling.scaled || *algo::fused_scaled_unsupported(plan) == '\0';
  key.world_size = world_size;
  key.gpu = gpu;
  return key;
}

ProblemKey key_of(const algo::MatmulReduceScatterPlan& plan, int world_size, const std::string& gpu) {
  ProblemKey key;
  key.op = Op::kMatmulReduceScatter;
  key.M = plan.M;
  key.N = plan.N;
  key.K = plan.k_local * world_size;
  key.dtype = plan.dtype;
  key.last_dim = plan.scatter_last;
  key.fused_kernel = !plan.scaling.scaled || *algo::fused_scaling_unsupported(plan.scaling, plan.dtype) == '\0';
  key.world_size = world_size;
  key.gpu = gpu;
  return key;
}

bool fused_kernel_applies(const ProblemKey& key) {
  if (key.last_dim || !key.fused_kernel) return false;
  if (key.op == Op::kAllGatherMatmul) return true;
  // matmul_reduce_scatter: the rows test of fused_rs_unsupported (which also needs the pointers).
  return key.M % key.world_size == 0 && algo::fused_rs_takes_rows(key.M / key.world_size);
}

Choice choose_for(const Communicator& comm, const ProblemKey& key) {
  const Communicator::Impl& m = impl_of(comm);
  return choose(key, tuning_cache(m.tuning_cache), is_hopper(m.cc_major, m.cc_minor) && fused_kernel_applies(key));
}

namespace {

constexpr size_t kMaxRememberedChoices = 4096;

// auto's choices made so far on a communicator, by (op, M, N, K, dtype, last dim, whether the fused
// kernel takes the call): {algorithm, chunks per rank}. A call's choice is then a lookup, not a model
// evaluation.
struct RememberedChoices final : comm::Attachment {
  std::map<std::array<int64_t, 7>, std::pair<int, int>> by_key;
  void detach(bool /*healthy*/) override {}
};

}  // namespace

OpOptions resolve(Communicator& comm, const ProblemKey& key, const OpOptions& options) {
  if (options.algorithm != Algorithm::kAuto) return options;
  OpOptions resolved = options;
  auto& memo =
      impl_of(comm).attached<RememberedChoices>([] { return std::make_unique<RememberedChoices>(); }).by_key;
  const std::array<int64_t, 7> k{static_cast<int64_t>(key.op), key.M, key.N, key.K, static_cast<int64_t>(key.dtype),
                                 key.last_dim ? 1 : 0, key.fused_kernel ? 1 : 0};
  auto it = memo.find(k);
  if (it == memo.end()) {
    // Bounded for jobs whose shapes keep changing; a forgotten choice is only recomputed.
    if (memo.size() >= kMaxRememberedChoices) memo.clear();
    const Choice c = algo::one_node(comm) ? choose_for(comm, key) : Choice{};  // across nodes: sequential
    it = memo.emplace(k, std::make_pair(static_cast<int>(c.algorithm), c.chunks_per_rank)).first;
  }
  resolved.algorithm = static_cast<Algorithm>(it->second.first);
  resolved.chunks_per_rank = it->second.second;
  return resolved;
}

}  // namespace asynctp::tune
