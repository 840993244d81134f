#include "shapes.h"

#include <ATen/ATen.h>

#include <utility>

namespace asynctp::torch_ext {
namespace {

int64_t normalise_dim(int64_t dim, int64_t ndim, const char* op, const char* name) {
  const int64_t d = dim < 0 ? dim + ndim : dim;
  if (d < 0 || d >= ndim) {
    refuse(op, ": ", name, " is ", dim, "; expected a dim of a ", ndim, "-dim tensor (-", ndim, " to ", ndim - 1, ")");
  }
  return d;
}

// (the leading shape, t as a dense [rows, t.size(-1)] matrix): `dim` moved to the front first unless
// it is already there or is the last dim, whose rows are t's own.
std::pair<std::vector<int64_t>, at::Tensor> as_rows(const at::Tensor& t, int64_t dim) {
  std::vector<int64_t> lead(t.sizes().begin(), t.sizes().end() - 1);
  if (t.dim() == 2) return {std::move(lead), t.contiguous()};  // no new view: the common case's host time
  const at::Tensor x = (dim == 0 || dim == t.dim() - 1) ? t : t.movedim(dim, 0);
  lead.assign(x.sizes().begin(), x.sizes().end() - 1);
  return {std::move(lead), x.reshape({-1, x.size(-1)}).contiguous()};
}

std::vector<int64_t> with_last(std::vector<int64_t> shape, int64_t last) {
  shape.push_back(last);
  return shape;
}

}  // namespace

AllGatherShapes::AllGatherShapes(const at::Tensor& a_shard, int64_t gather_dim, int world_size)
    : world(world_size) {
  const char* op = "all_gather_matmul";
  if (a_shard.dim() < 2) refuse(op, ": a_shard has ", a_shard.dim(), " dims; expected at least 2 ([..., K])");
  dim = normalise_dim(gather_dim, a_shard.dim(), op, "gather_dim");
  along_k = dim == a_shard.dim() - 1;
  std::tie(lead, a2) = as_rows(a_shard, dim);
  rows = along_k ? a2.size(0) : a2.size(0) * world;
  k = along_k ? a2.size(1) * world : a2.size(1);
}

at::Tensor AllGatherShapes::unflatten(const at::Tensor& flat) const {
  if (lead.size() == 1) return flat;  // a 2-dim A: the library's result is torch's
  if (along_k) return flat.view(with_last(lead, flat.size(-1)));
  std::vector<int64_t> shape{world};
  shape.insert(shape.end(), lead.begin(), lead.end());
  return flat.view(with_last(shape, flat.size(-1))).flatten(0, 1).movedim(0, dim);
}

ReduceScatterShapes::ReduceScatterShapes(const at::Tensor& a, const at::Tensor& b, int64_t scatter_dim,
                                         int world_size)
    : world(world_size) {
  const char* op = "matmul_reduce_scatter";
  if (a.dim() < 2) refuse(op, ": a has ", a.dim(), " dims; expected at least 2 ([..., K])");
  if (b.dim() != 2) refuse(op, ": b has ", b.dim(), " dims; expected 2 ([K, N])");
  dim = normalise_dim(scatter_dim, a.dim(), op, "scatter_dim");
  along_n = dim == a.dim() - 1;
  const int64_t n = b.size(1);
  std::tie(lead, a2) = as_rows(a, dim);
  if (along_n) {
    if (n % world != 0) {
      refuse(op, ": b.shape[1] (N) is ", n, "; with scatter_dim last it must divide by the world size ", world);
    }
    out_shape = {a2.size(0), n / world};
  } else {
    if (lead[0] % world != 0) {
      refuse(op, ": a.shape[", dim, "] is ", lead[0], "; it must divide by the world size ", world,
             " (each rank keeps an equal slice along scatter_dim)");
    }
    out_shape = {a2.size(0) / world, n};
  }
}

at::Tensor ReduceScatterShapes::unflatten(const at::Tensor& flat) const {
  if (lead.size() == 1) return flat;
  if (along_n) return flat.view(with_last(lead, flat.size(-1)));
  std::vector<int64_t> shape{lead[0] / world};
  shape.insert(shape.end(), lead.begin() + 1, lead.end());
  return flat.view(with_last(shape, flat.size(-1))).movedim(0, dim);
}

}  // namespace asynctp::torch_ext
