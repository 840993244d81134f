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
namespace {

bool well_formed(const TensorRef& t) {
  if (t.data == nullptr || t.ndim < 1 || t.ndim > TensorRef::kMaxDims) return false;
  if (t.dtype != DType::kBF16 && t.dtype != DType::kFP16) return false;
  for (int d = 0; d < t.ndim; ++d) {
    if (t.shape[d] <= 0) return false;
  }
  return true;
}

// a * b, or false where it overflows (the shapes are not yet validated: any int64 may come).
bool times(int64_t a, int64_t b, int64_t& out) { return !__builtin_mul_overflow(a, b, &out); }

// Rows of `t` with every dim but the last flattened, or false where they overflow.
bool rows(const TensorRef& t, int64_t& out) {
  out = 1;
  for (int d = 0; d + 1 < t.ndim; ++d) {
    if (!times(out, t.shape[d], out)) return false;
  }
  return true;
}

bool is_last(int dim, int ndim) { return ndim > 1 && (dim == -1 || dim == ndim - 1); }

// N of a well-formed 2-D B in `layout`, else 0.
int64_t columns_of_b(const TensorRef& b, BLayout layout) {
  if (!well_formed(b) || b.ndim != 2) return 0;
  return layout == BLayout::kColMajor ? b.shape[0] : b.shape[1];
}

bool finish(int world_size, const std::string& gpu, const TensorRef& a, ProblemKey& key) {
  key.dtype = a.dtype;
  key.world_size = world_size;
  key.gpu = gpu;
  return key.M > 0 && key.N > 0 && key.K > 0;
}

}  // namespace

bool all_gather_matmul_key(int world_size, const std::string& gpu, const TensorRef& a_shard,
                           const std::vector<TensorRef>& bs, int gather_dim, BLayout b_layout, ProblemKey& key) {
  if (!well_formed(a_shard) || bs.empty() || world_size < 1) return false;
  key = ProblemKey{};
  key.op = Op::kAllGatherMatmul;
  key.last_dim = is_last(gather_dim, a_shard.ndim);
  int64_t m = 0;
  if (!rows(a_shard, m) || !times(m, key.last_dim ? 1 : world_size, key.M) ||
      !times(a_shard.shape[a_shard.ndim - 1], key.last_dim ? world_size : 1, key.K)) {
    return false;
  }
  for (const TensorRef& b : bs) {
    const int64_t n = columns_of_b(b, b_layout);
    // Several Bs: one GEMM's worth of work each, one gather for all.
    if (n == 0 || __builtin_add_overflow(key.N, n, &key.N)) return false;
  }
  return finish(world_size, gpu, a_shard, key);
}

bool matmul_reduce_scatter_key(int world_size, const std::string& gpu, const TensorRef& a, const TensorRef& b,
                               int scatter_dim, BLayout b_layout, ProblemKey& key) {
  if (!well_formed(a) || world_size < 1) return false;
  key = ProblemKey{};
  key.op = Op::kMatmulReduceScatter;
  key.last_dim = is_last(scatter_dim, a.ndim);
  if (!rows(a, key.M) || !times(a.shape[a.ndim - 1], world_size, key.K)) return false;
  key.N = columns_of_b(b, b_layout);
  return finish(world_size, gpu, a, key);
}

bool fused_kernel_applies(const ProblemKey& key) {
  if (key.last_dim) return false;
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

// auto's choices made so far on a communicator, by (op, M, N, K, dtype, last dim): {algorithm, chunks
// per rank}. A call's choice is then a lookup, not a model evaluation.
struct RememberedChoices final : comm::Attachment {
  std::map<std::array<int64_t, 6>, std::pair<int, int>> by_key;
  void detach(bool /*healthy*/) override {}
};

// `options` with auto's choice for `key`, or sequential where the arguments could not be sized or where
// not every rank reaches every other's memory (across nodes only sequential runs). The choice is
// remembered per communicator: the host time of a call is part of its cost.
OpOptions with_choice(Communicator& comm, const OpOptions& options, bool sized, const ProblemKey& key) {
  OpOptions resolved = options;
  resolved.algorithm = Algorithm::kSequential;
  resolved.chunks_per_rank = 0;
  if (!sized) return resolved;
  auto& memo =
      impl_of(comm).attached<RememberedChoices>([] { return std::make_unique<RememberedChoices>(); }).by_key;
  const std::array<int64_t, 6> k{static_cast<int64_t>(key.op), key.M, key.N, key.K, static_cast<int64_t>(key.dtype),
                                 key.last_dim ? 1 : 0};
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

OpOptions with_choice_or_refusal(Communicator& comm, const OpOptions& options, bool sized, const ProblemKey& key,
                                  std::string& refusal) {
  try {
    return with_choice(comm, options, sized, key);
  } catch (const Error& e) {
    refusal = e.what();
    OpOptions fallback = options;
    fallback.algorithm = Algorithm::kSequential;
    fallback.chunks_per_rank = 0;
    return fallback;
  }
}

}  // namespace

OpOptions resolve_all_gather_matmul(Communicator& comm, const TensorRef& a_shard,
                                    const std::vector<TensorRef>& bs, int gather_dim, const OpOptions& options,
                                    std::string& refusal) {
  if (options.algorithm != Algorithm::kAuto) return options;
  ProblemKey key;
  const bool sized =
      all_gather_matmul_key(comm.world_size(), impl_of(comm).gpu_name, a_shard, bs, gather_dim, options.b_layout, key);
  return with_choice_or_refusal(comm, options, sized, key, refusal);
}

OpOptions resolve_matmul_reduce_scatter(Communicator& comm, const TensorRef& a, const TensorRef& b,
                                        int scatter_dim, const OpOptions& options, std::string& refusal) {
  if (options.algorithm != Algorithm::kAuto) return options;
  ProblemKey key;
  const bool sized =
      matmul_reduce_scatter_key(comm.world_size(), impl_of(comm).gpu_name, a, b, scatter_dim, options.b_layout, key);
  return with_choice_or_refusal(comm, options, sized, key, refusal);
}

}  // namespace asynctp::tune
