#include "tune/resolve.h"

#include "comm/communicator_impl.h"
#include "algo/fused.h"

namespace asynctp::tune {
namespace {

bool well_formed(const TensorRef& t) {
  if (t.data == nullptr || t.ndim < 1 || t.ndim > TensorRef::kMaxDims) return false;
  if (t.dtype != DType::kBF16 && t.dtype != DType::kFP16) return false;
  for (int d = 0; d < t.ndim; ++d) {
    if (t.shape[d] <= 0) return false;
  }
  return true;
}

// Rows of `t` with every dim but the last flattened.
int64_t rows(const TensorRef& t) {
  int64_t r = 1;
  for (int d = 0; d + 1 < t.ndim; ++d) r *= t.shape[d];
  return r;
}

bool is_last(int dim, int ndim) { return ndim > 1 && (dim == -1 || dim == ndim - 1); }

// N of a well-formed 2-D B in `layout`, else 0.
int64_t columns_of_b(const TensorRef& b, BLayout layout) {
  if (!well_formed(b) || b.ndim != 2) return 0;
  return layout == BLayout::kColMajor ? b.shape[0] : b.shape[1];
}

bool finish(const Communicator& comm, const TensorRef& a, ProblemKey& key) {
  key.dtype = a.dtype;
  key.world_size = comm.world_size();
  key.gpu = comm.impl().gpu_name;
  return key.M > 0 && key.N > 0 && key.K > 0;
}

}  // namespace

bool all_gather_matmul_key(const Communicator& comm, const TensorRef& a_shard, const std::vector<TensorRef>& bs,
                           int gather_dim, BLayout b_layout, ProblemKey& key) {
  if (!well_formed(a_shard) || bs.empty()) return false;
  key = ProblemKey{};
  key.op = Op::kAllGatherMatmul;
  key.last_dim = is_last(gather_dim, a_shard.ndim);
  const int ws = comm.world_size();
  key.M = rows(a_shard) * (key.last_dim ? 1 : ws);
  key.K = a_shard.shape[a_shard.ndim - 1] * (key.last_dim ? ws : 1);
  for (const TensorRef& b : bs) {
    const int64_t n = columns_of_b(b, b_layout);
    if (n == 0) return false;
    key.N += n;  // several Bs: one GEMM's worth of work each, one gather for all
  }
  return finish(comm, a_shard, key);
}

bool matmul_reduce_scatter_key(const Communicator& comm, const TensorRef& a, const TensorRef& b, int scatter_dim,
                               BLayout b_layout, ProblemKey& key) {
  if (!well_formed(a)) return false;
  key = ProblemKey{};
  key.op = Op::kMatmulReduceScatter;
  key.last_dim = is_last(scatter_dim, a.ndim);
  key.M = rows(a);
  key.K = a.shape[a.ndim - 1] * comm.world_size();
  key.N = columns_of_b(b, b_layout);
  return finish(comm, a, key);
}

bool fused_kernel_applies(const ProblemKey& key) {
  if (key.last_dim) return false;
  if (key.op == Op::kAllGatherMatmul) return true;
  // matmul_reduce_scatter: the rows test of fused_rs_unsupported (which also needs the pointers).
  return key.M % key.world_size == 0 && algo::fused_rs_takes_rows(key.M / key.world_size);
}

Choice choose_for(const Communicator& comm, const ProblemKey& key) {
  return choose(key, tuning_cache(comm.impl().tuning_cache), fused_kernel_applies(key));
}

namespace {

constexpr size_t kMaxRememberedChoices = 4096;

// `options` with auto's choice for `key`, or sequential where the arguments could not be sized. The
// choice is remembered per communicator: the host time of a call is part of its cost.
OpOptions with_choice(const Communicator& comm, const OpOptions& options, bool sized, const ProblemKey& key) {
  OpOptions resolved = options;
  resolved.algorithm = Algorithm::kSequential;
  resolved.chunks_per_rank = 0;
  if (!sized) return resolved;
  auto& memo = comm.impl().auto_choices;
  const std::array<int64_t, 6> k{static_cast<int64_t>(key.op), key.M, key.N, key.K, static_cast<int64_t>(key.dtype),
                                 key.last_dim ? 1 : 0};
  auto it = memo.find(k);
  if (it == memo.end()) {
    // Bounded for jobs whose shapes keep changing; a forgotten choice is only recomputed.
    if (memo.size() >= kMaxRememberedChoices) memo.clear();
    const Choice c = choose_for(comm, key);
    it = memo.emplace(k, std::make_pair(static_cast<int>(c.algorithm), c.chunks_per_rank)).first;
  }
  resolved.algorithm = static_cast<Algorithm>(it->second.first);
  resolved.chunks_per_rank = it->second.second;
  return resolved;
}

}  // namespace

OpOptions resolve_all_gather_matmul(const Communicator& comm, const TensorRef& a_shard,
                                    const std::vector<TensorRef>& bs, int gather_dim, const OpOptions& options) {
  if (options.algorithm != Algorithm::kAuto) return options;
  ProblemKey key;
  const bool sized = all_gather_matmul_key(comm, a_shard, bs, gather_dim, options.b_layout, key);
  return with_choice(comm, options, sized, key);
}

OpOptions resolve_matmul_reduce_scatter(const Communicator& comm, const TensorRef& a, const TensorRef& b,
                                        int scatter_dim, const OpOptions& options) {
  if (options.algorithm != Algorithm::kAuto) return options;
  ProblemKey key;
  const bool sized = matmul_reduce_scatter_key(comm, a, b, scatter_dim, options.b_layout, key);
  return with_choice(comm, options, sized, key);
}

}  // namespace asynctp::tune
