// The ops' autograd: the backward of each op is the other op (docs/reference/python_api.md). A call
// where no gradient is wanted goes straight to the CUDA implementation, with no graph node.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/library.h>

#include <string>
#include <vector>

#include "ops.h"

namespace asynctp::torch_ext {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using AgSignature = AllGatherResult(const at::Tensor&, at::TensorList, int64_t, std::string_view, bool,
                                    std::string_view, int64_t);
using RsSignature = at::Tensor(const at::Tensor&, const at::Tensor&, std::string_view, int64_t, std::string_view,
                               std::string_view, int64_t);

const c10::TypedOperatorHandle<AgSignature>& ag_op() {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("asynctp::all_gather_matmul", "")
                             .typed<AgSignature>();
  return op;
}

const c10::TypedOperatorHandle<RsSignature>& rs_op() {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("asynctp::matmul_reduce_scatter", "")
                             .typed<RsSignature>();
  return op;
}

at::Tensor wait(const at::Tensor& t) {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("_c10d_functional::wait_tensor", "")
                             .typed<at::Tensor(const at::Tensor&)>();
  return op.call(t);
}

// torch.distributed._functional_collectives.all_gather_tensor(t, dim, group), waited on.
at::Tensor all_gather(const at::Tensor& t, int64_t dim, const std::string& group, int world) {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("_c10d_functional::all_gather_into_tensor", "")
          .typed<at::Tensor(const at::Tensor&, int64_t, std::string)>();
  at::Tensor gathered = wait(op.call(t.contiguous(), world, group));
  return dim == 0 ? gathered : at::cat(gathered.chunk(world, 0), dim);
}

// torch.distributed._functional_collectives.reduce_scatter_tensor(t, "sum", dim, group), waited on.
at::Tensor reduce_scatter(const at::Tensor& t, int64_t dim, const std::string& group, int world) {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("_c10d_functional::reduce_scatter_tensor", "")
          .typed<at::Tensor(const at::Tensor&, std::string, int64_t, std::string)>();
  const at::Tensor rows = dim == 0 ? t.contiguous() : at::cat(t.chunk(world, dim), 0);
  return wait(op.call(rows, "sum", world, group));
}

// The process group's size, without its communicator: backward also runs on fake tensors and fake groups.
int world_of(const std::string& group) { return c10d::resolve_process_group(group)->getSize(); }

at::Tensor flat_rows(const at::Tensor& t) { return t.reshape({-1, t.size(-1)}); }

bool wants_grad(std::initializer_list<at::TensorList> lists) {
  if (!at::GradMode::is_enabled()) return false;
  for (at::TensorList list : lists) {
    for (const at::Tensor& t : list) {
      if (t.requires_grad()) return true;
    }
  }
  return false;
}

struct AllGatherMatmul : torch::autograd::Function<AllGatherMatmul> {
  // Outputs: the gathered A where return_a, then one product per B.
  static variable_list forward(AutogradContext* ctx, const at::Tensor& a_shard, at::TensorList bs, int64_t gather_dim,
                               const std::string& group, bool return_a, const std::string& algorithm, int64_t chunks) {
    at::AutoDispatchBelowADInplaceOrView below;
    auto [a_full, outs] = ag_op().call(a_shard, bs, gather_dim, group, return_a, algorithm, chunks);
    ctx->saved_data["gather_dim"] = gather_dim;
    ctx->saved_data["group"] = group;
    ctx->saved_data["return_a"] = return_a;
    ctx->saved_data["algorithm"] = algorithm;
    ctx->saved_data["chunks"] = chunks;
    // The gathered A is needed for the weights' gradients: kept where the op returned it, else gathered
    // again in backward (memory over time, as activation checkpointing would choose).
    variable_list saved{return_a ? *a_full : a_shard};
    saved.insert(saved.end(), bs.begin(), bs.end());
    ctx->save_for_backward(saved);
    variable_list results;
    if (return_a) results.push_back(*a_full);
    results.insert(results.end(), outs.begin(), outs.end());
    return results;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const int64_t gather_dim = ctx->saved_data["gather_dim"].toInt();
    const std::string group = ctx->saved_data["group"].toStringRef();
    const bool return_a = ctx->saved_data["return_a"].toBool();
    const std::string algorithm = ctx->saved_data["algorithm"].toStringRef();
    const int64_t chunks = ctx->saved_data["chunks"].toInt();
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& kept = saved[0];
    const std::vector<at::Tensor> bs(saved.begin() + 1, saved.end());
    const at::Tensor grad_a_full = return_a ? grads[0] : at::Tensor();
    const std::vector<at::Tensor> grad_outs(grads.begin() + (return_a ? 1 : 0), grads.end());
    const int world = world_of(group);

    std::vector<at::Tensor> gs, gbs;
    for (size_t i = 0; i < grad_outs.size(); ++i) {
      if (grad_outs[i].defined()) {
        gs.push_back(grad_outs[i]);
        gbs.push_back(bs[i]);
      }
    }
    at::Tensor grad_a_shard;
    if (!gs.empty()) {
      // d(a_shard) = reduce_scatter(sum_i dC_i @ B_i^T): one matmul_reduce_scatter over the Bs side by side.
      const at::Tensor g = gs.size() > 1 ? at::cat(gs, -1) : gs[0];
      const at::Tensor b = gbs.size() > 1 ? at::cat(gbs, 1) : gbs[0];
      grad_a_shard = rs_op().call(g, b.t(), "sum", gather_dim, group, algorithm, chunks);
    }
    if (grad_a_full.defined()) {
      const at::Tensor rs = reduce_scatter(grad_a_full, gather_dim, group, world);
      grad_a_shard = grad_a_shard.defined() ? grad_a_shard + rs : rs;
    }
    variable_list result{grad_a_shard};
    at::Tensor a_rows_t;
    if (!gs.empty()) {
      // Once for every B (a copy where A was gathered along a middle dim).
      a_rows_t = flat_rows(return_a ? kept : all_gather(kept, gather_dim, group, world)).t();
    }
    for (const at::Tensor& g : grad_outs) result.push_back(g.defined() ? a_rows_t.mm(flat_rows(g)) : at::Tensor());
    result.resize(result.size() + 5);  // gather_dim, group, return_a, algorithm, chunks
    return result;
  }
};

struct MatmulReduceScatter : torch::autograd::Function<MatmulReduceScatter> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b, const std::string& reduce_op,
                            int64_t scatter_dim, const std::string& group, const std::string& algorithm,
                            int64_t chunks) {
    at::AutoDispatchBelowADInplaceOrView below;
    ctx->saved_data["reduce_op"] = reduce_op;
    ctx->saved_data["scatter_dim"] = scatter_dim;
    ctx->saved_data["group"] = group;
    ctx->saved_data["algorithm"] = algorithm;
    ctx->saved_data["chunks"] = chunks;
    ctx->save_for_backward({a, b});
    return rs_op().call(a, b, reduce_op, scatter_dim, group, algorithm, chunks);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const int64_t scatter_dim = ctx->saved_data["scatter_dim"].toInt();
    const std::string group = ctx->saved_data["group"].toStringRef();
    const std::string algorithm = ctx->saved_data["algorithm"].toStringRef();
    const int64_t chunks = ctx->saved_data["chunks"].toInt();
    const variable_list saved = ctx->get_saved_variables();
    at::Tensor grad_out = grads[0];
    if (ctx->saved_data["reduce_op"].toStringRef() == "avg") grad_out = grad_out / world_of(group);
    // dP = all_gather(d_out) along scatter_dim; d(a) = dP @ b^T is one all_gather_matmul, which also
    // returns dP for d(b) = a^T @ dP.
    auto [grad_p, grad_as] = ag_op().call(grad_out, {saved[1].t()}, scatter_dim, group, true, algorithm, chunks);
    const at::Tensor grad_b = flat_rows(saved[0]).t().mm(flat_rows(*grad_p));
    return {grad_as[0], grad_b, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

AllGatherResult all_gather_matmul_autograd(c10::DispatchKeySet keys, const at::Tensor& a_shard, at::TensorList bs,
                                           int64_t gather_dim, std::string_view group, bool return_a,
                                           std::string_view algorithm, int64_t chunks) {
  if (!wants_grad({a_shard, bs})) {
    return ag_op().redispatch(keys & c10::after_ADInplaceOrView_keyset, a_shard, bs, gather_dim, group, return_a,
                              algorithm, chunks);
  }
  variable_list results = AllGatherMatmul::apply(a_shard, bs, gather_dim, std::string(group), return_a,
                                                 std::string(algorithm), chunks);
  std::optional<at::Tensor> a_full;
  if (return_a) a_full = results[0];
  return {a_full, std::vector<at::Tensor>(results.begin() + (return_a ? 1 : 0), results.end())};
}

at::Tensor matmul_reduce_scatter_autograd(c10::DispatchKeySet keys, const at::Tensor& a, const at::Tensor& b,
                                          std::string_view reduce_op, int64_t scatter_dim, std::string_view group,
                                          std::string_view algorithm, int64_t chunks) {
  if (!wants_grad({a, b})) {
    return rs_op().redispatch(keys & c10::after_ADInplaceOrView_keyset, a, b, reduce_op, scatter_dim, group,
                              algorithm, chunks);
  }
  return MatmulReduceScatter::apply(a, b, std::string(reduce_op), scatter_dim, std::string(group),
                                    std::string(algorithm), chunks);
}

}  // namespace
}  // namespace asynctp::torch_ext

TORCH_LIBRARY_IMPL(asynctp, Autograd, m) {
  m.impl("all_gather_matmul", &asynctp::torch_ext::all_gather_matmul_autograd);
  m.impl("matmul_reduce_scatter", &asynctp::torch_ext::matmul_reduce_scatter_autograd);
}
