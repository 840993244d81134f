// The torch ops asynctp::all_gather_matmul and asynctp::matmul_reduce_scatter: their schemas and
// their CUDA implementations, which call the C interface on the current CUDA stream.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string_view>
#include <tuple>
#include <vector>

namespace asynctp::torch_ext {

using AllGatherResult = std::tuple<std::optional<at::Tensor>, std::vector<at::Tensor>>;

AllGatherResult all_gather_matmul_cuda(const at::Tensor& a_shard, at::TensorList bs, int64_t gather_dim,
                                       std::string_view group_name, bool return_a, std::string_view algorithm,
                                       int64_t chunks_per_rank);
at::Tensor matmul_reduce_scatter_cuda(const at::Tensor& a, const at::Tensor& b, std::string_view reduce_op,
                                      int64_t scatter_dim, std::string_view group_name, std::string_view algorithm,
                                      int64_t chunks_per_rank);

}  // namespace asynctp::torch_ext
