// Internal: argument validation and the 2-D problem each op reduces to. Pure functions of the
// arguments and the world size, so the rules are tested without a GPU.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "algo/problem.h"
#include "asynctp/ops.h"
#include "asynctp/scaled_ops.h"

namespace asynctp::ops {

// The problems the algorithms take (algo/problem.h), made here.
using algo::AllGatherMatmulPlan;
using algo::MatmulReduceScatterPlan;

// Throw asynctp::Error naming the argument and what was expected.
AllGatherMatmulPlan plan_all_gather_matmul(int world_size, const TensorRef& a_shard, const std::vector<TensorRef>& bs,
                                           int gather_dim, const std::vector<TensorRef>& outputs,
                                           const TensorRef& gathered_a, const OpOptions& options);

MatmulReduceScatterPlan plan_matmul_reduce_scatter(int world_size, const TensorRef& a, const TensorRef& b,
                                                   int scatter_dim, ReduceOp reduce_op, const TensorRef& output,
                                                   const OpOptions& options);

// The scaled ops (asynctp/scaled_ops.h): the same problems, with plan.scaling set.
AllGatherMatmulPlan plan_all_gather_scaled_matmul(int world_size, const TensorRef& a_shard,
                                                  const std::vector<TensorRef>& bs, const TensorRef& a_scale,
                                                  const std::vector<TensorRef>& b_scales, int gather_dim,
                                                  const std::vector<TensorRef>& outputs, const TensorRef& gathered_a,
                                                  const std::vector<algo::ScaledEpilogue>& epilogues,
                                                  const ScaledOpOptions& options);

MatmulReduceScatterPlan plan_scaled_matmul_reduce_scatter(int world_size, const TensorRef& a, const TensorRef& b,
                                                          const TensorRef& a_scale, const TensorRef& b_scale,
                                                          int scatter_dim, ReduceOp reduce_op, const TensorRef& output,
                                                          const algo::ScaledEpilogue& epilogue,
                                                          const ScaledOpOptions& options);

// An all_gather_scaled_matmul's epilogue for each of `count` Bs, from its optional per-B biases and
// result scales (an empty vector: none); refused where a vector's length is neither 0 nor `count`.
std::vector<algo::ScaledEpilogue> scaled_epilogues(const char* op, size_t count, const std::vector<TensorRef>& biases,
                                                   const std::vector<TensorRef>& result_scales);

// What ranks compare before an op: named integers, equal on every rank when the calls agree.
struct Signature {
  std::vector<std::pair<const char*, int64_t>> fields;
  void add(const char* name, int64_t value) { fields.emplace_back(name, value); }
};

Signature signature_of(const char* op, const TensorRef& a, const std::vector<TensorRef>& bs, int dim,
                       const OpOptions& options, int64_t extra);

std::string shape_string(const TensorRef& t);

}  // namespace asynctp::ops
