// Internal: the planners the unscaled and the scaled ops share (plan.cc), for the dtypes each op's
// tensors must have.
#pragma once

#include <vector>

#include "ops/plan.h"

namespace asynctp::ops {

// The dtypes an op's tensors must have (A and the gathered A, B, the outputs), and the rule an error
// states.
struct Dtypes {
  DType a, b, out;
  const char* rule;
};

// The options every op takes (algorithm, B's layout, chunks), each against its range.
void check_options(const char* op, const OpOptions& options);

AllGatherMatmulPlan plan_typed_all_gather_matmul(const char* op, int world_size, const TensorRef& a,
                                                 const std::vector<TensorRef>& bs, int gather_dim,
                                                 const std::vector<TensorRef>& outputs, const TensorRef& gathered_a,
                                                 const OpOptions& options, const Dtypes& types);

MatmulReduceScatterPlan plan_typed_matmul_reduce_scatter(const char* op, int world_size, const TensorRef& a,
                                                         const TensorRef& b, int scatter_dim, ReduceOp reduce_op,
                                                         const TensorRef& output, const OpOptions& options,
                                                         const Dtypes& types);

}  // namespace asynctp::ops
