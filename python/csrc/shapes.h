// How the torch ops' N-dim tensors and dims map onto the library's 2-dim ops, and the results back:
// the C++ form of python/asynctp/_shapes.py, which the fake implementations use; the two must agree
// (python/tests/test_torch_extension.py compares them).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

namespace asynctp::torch_ext {

// all_gather_matmul: gather_dim last concatenates the shards along K (the library's gather_dim 1);
// any other dim is moved to the front and the rest flattened into rows (gather_dim 0).
struct AllGatherShapes {
  AllGatherShapes(const at::Tensor& a_shard, int64_t gather_dim, int world);
  at::Tensor unflatten(const at::Tensor& flat) const;

  int world;
  int64_t dim;
  bool along_k;
  std::vector<int64_t> lead;
  at::Tensor a2;  // A as a dense [rows, K] matrix (a copy where gather_dim is a middle dim)
  int64_t rows;   // of the product
  int64_t k;      // of the gathered A
};

// matmul_reduce_scatter: scatter_dim last splits N (the library's scatter_dim 1); any other dim is
// moved to the front and split there (scatter_dim 0).
struct ReduceScatterShapes {
  ReduceScatterShapes(const at::Tensor& a, const at::Tensor& b, int64_t scatter_dim, int world);
  at::Tensor unflatten(const at::Tensor& flat) const;

  int world;
  int64_t dim;
  bool along_n;
  std::vector<int64_t> lead;
  at::Tensor a2;
  std::vector<int64_t> out_shape;
};

// An argument refused by the ops' own checks; shared with the other ranks before it is thrown.
struct Refusal {
  std::string what;
};

template <typename... Parts>
[[noreturn]] void refuse(const Parts&... parts) {
  std::ostringstream s;
  (s << ... << parts);
  throw Refusal{s.str()};
}

}  // namespace asynctp::torch_ext
