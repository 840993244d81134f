// asynctp-soak's calls: random legal arguments for either op, drawn from a seeded generator so that
// every rank draws the same sequence, and the tensors each rank passes for them.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "asynctp/ops.h"

namespace asynctp::soak {

struct Call {
  bool ag = true;          // all_gather_matmul, else matmul_reduce_scatter
  DType dtype = DType::kBF16;
  BLayout b_layout = BLayout::kRowMajor;
  bool last_dim = false;   // gather_dim / scatter_dim last, else 0
  int64_t M = 0, N = 0, K = 0;  // the global problem; N of the first B (a second is 8 wider)
  int num_b = 1;           // ag only
  bool return_a = false;   // ag only
  ReduceOp reduce = ReduceOp::kSum;  // rs only
};

// A random legal call with every dim of the global problem at most `max_dim` (a multiple of 8 times
// the world size, >= 256 * world size): dtype, B layout, dim, shapes, number of B, return_a and the
// reduction vary. Half of the reduce-scatters along dim 0 have rows per rank a multiple of 256 (the
// fused kernel's 2 x 1 clusters; 128 takes it too, in one-CTA clusters) and a third of the all-gathers along dim 0 have them a multiple of 128.
Call draw_call(std::mt19937_64& rng, bool ag, int world_size, int64_t max_dim);

std::string describe(const Call& c);

// Elements each device buffer needs for any call draw_call makes with `max_dim`.
int64_t max_elements(int64_t max_dim);

// This rank's tensors for `c` over the given buffers (each at least max_elements long).
struct Tensors {
  TensorRef a;                 // ag: a_shard; rs: a
  std::vector<TensorRef> bs;   // rs: one
  std::vector<TensorRef> outs; // rs: one
  TensorRef gathered;          // ag with return_a, else undefined
  int dim = 0;                 // gather_dim / scatter_dim
  int64_t out_rows = 0, out_cols = 0, out_row0 = 0, out_col0 = 0;  // this rank's part of the result
};
Tensors tensors_of(const Call& c, int rank, int world_size, void* a, void* const b[2], void* const out[2],
                   void* gathered);

}  // namespace asynctp::soak
