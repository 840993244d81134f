// Internal: argument validation and the 2-D problem each op reduces to. Pure functions of the
// arguments and the world size, so the rules are tested without a GPU.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "asynctp/ops.h"

namespace asynctp::ops {

struct AllGatherMatmulPlan {
  bool gather_last = false;
  DType dtype = DType::kBF16;
  BLayout b_layout = BLayout::kRowMajor;
  int64_t m_local = 0;  // rows per rank (gather 0), or all rows (gather last)
  int64_t M = 0;        // rows of A after the gather
  int64_t k_local = 0;  // K per rank (gather last), or K
  int64_t K = 0;
  std::vector<int64_t> N;  // per B
  bool return_a = false;
};

struct MatmulReduceScatterPlan {
  bool scatter_last = false;
  DType dtype = DType::kBF16;
  BLayout b_layout = BLayout::kRowMajor;
  ReduceOp reduce_op = ReduceOp::kSum;
  int64_t M = 0, N = 0, k_local = 0;
  int64_t out_rows = 0, out_cols = 0;  // this rank's slice
};

// Throw asynctp::Error naming the argument and what was expected.
AllGatherMatmulPlan plan_all_gather_matmul(int world_size, const TensorRef& a_shard, const std::vector<TensorRef>& bs,
                                           int gather_dim, const std::vector<TensorRef>& outputs,
                                           const TensorRef& gathered_a, const OpOptions& options);

MatmulReduceScatterPlan plan_matmul_reduce_scatter(int world_size, const TensorRef& a, const TensorRef& b,
                                                   int scatter_dim, ReduceOp reduce_op, const TensorRef& output,
                                                   const OpOptions& options);

// What ranks compare before an op: named integers, equal on every rank when the calls agree.
struct Signature {
  std::vector<std::pair<const char*, int64_t>> fields;
  void add(const char* name, int64_t value) { fields.emplace_back(name, value); }
};

Signature signature_of(const char* op, const TensorRef& a, const std::vector<TensorRef>& bs, int dim,
                       const OpOptions& options, int64_t extra);

std::string shape_string(const TensorRef& t);

}  // namespace asynctp::ops
