#include "ops/plan.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "common/check.h"
#include "ops/plan_typed.h"

namespace asynctp::ops {
namespace {

using detail::cat;

constexpr int64_t kMaxElements = int64_t{1} << 59;

std::string shape_of(const int64_t* dims, int n) {
  std::string s = "[";
  for (int i = 0; i < n; ++i) s += cat(i ? ", " : "", dims[i]);
  return s + "]";
}

constexpr const char* kOneDtype = "inputs and outputs share one dtype, bf16 or fp16";

// The checks every tensor argument gets: defined, a supported and matching dtype, dense, aligned,
// no zero-size dim.
void check_tensor(const char* op, const char* name, const TensorRef& t, DType dtype, int min_ndim, int max_ndim,
                  const char* rule = kOneDtype) {
  ASYNCTP_CHECK(t.ndim >= min_ndim && t.ndim <= max_ndim, op, ": ", name, " must have ",
                min_ndim == max_ndim ? cat(min_ndim) : cat(min_ndim, " to ", max_ndim), " dims, got ", t.ndim,
                t.ndim ? cat(" (shape ", shape_string(t), ")") : std::string());
  ASYNCTP_CHECK(t.dtype == dtype, op, ": ", name, " is ", dtype_name(t.dtype), " but expected ", dtype_name(dtype),
                " (", rule, ")");
  int64_t count = 1;
  for (int d = 0; d < t.ndim; ++d) {
    ASYNCTP_CHECK(t.shape[d] > 0, op, ": ", name, " has shape ", shape_string(t),
                  "; every dim must be > 0");
    // Byte counts and offsets are int64 throughout: the element count must leave room for them.
    ASYNCTP_CHECK(!__builtin_mul_overflow(count, t.shape[d], &count) && count <= kMaxElements, op, ": ", name,
                  " has shape ", shape_string(t), ", more than 2^59 elements; expected a tensor that fits in memory");
  }
  ASYNCTP_CHECK(t.is_dense(), op, ": ", name, " with shape ", shape_string(t), " has strides ",
                shape_of(t.strides, t.ndim), "; expected a dense row-major tensor (make it contiguous first)");
  ASYNCTP_CHECK(t.data != nullptr, op, ": ", name, " has a null data pointer");
  ASYNCTP_CHECK(reinterpret_cast<uintptr_t>(t.data) % 16 == 0, op, ": ", name, " data pointer ", t.data,
                " is not 16-byte aligned; expected 16-byte alignment");
}

// The GEMM kernels (CUTLASS's problem shape, cuBLASLt's leading dimensions on some paths, the fused
// GEMM's row flags) index each matrix dimension with 32-bit integers; element offsets are 64-bit.
void check_gemm_dim(const char* op, const char* dim, int64_t value, const std::string& from) {
  ASYNCTP_CHECK(value <= INT32_MAX, op, ": the GEMM's ", dim, " is ", value, " (", from, "); expected at most ",
                INT32_MAX, " (2^31 - 1): split the call");
}

bool overlap(const TensorRef& x, const TensorRef& y) {
  const auto* x0 = static_cast<const char*>(x.data);
  const auto* y0 = static_cast<const char*>(y.data);
  return x0 < y0 + y.bytes() && y0 < x0 + x.bytes();
}

void check_no_overlap(const char* op, const char* out_name, const TensorRef& out, const char* in_name,
                      const TensorRef& in) {
  ASYNCTP_CHECK(!overlap(out, in), op, ": ", out_name, " overlaps ", in_name, "; outputs must not share memory with ",
                "inputs or with each other");
}

int normalize_dim(const char* op, const char* name, int dim, int ndim) {
  const int d = dim < 0 ? dim + ndim : dim;
  ASYNCTP_CHECK(d == 0 || d == ndim - 1, op, ": ", name, " is ", dim, " for a ", ndim,
                "-D input; expected 0 or the last dim (", ndim - 1, " or -1)");
  return d;
}

void check_dtype_supported(const char* op, DType dtype) {
  ASYNCTP_CHECK(dtype == DType::kBF16 || dtype == DType::kFP16, op, ": dtype ", dtype_name(dtype),
                " is not supported; expected bf16 or fp16");
}


}  // namespace

std::string shape_string(const TensorRef& t) { return shape_of(t.shape, t.ndim); }

void check_options(const char* op, const OpOptions& options) {
  const Algorithm a = options.algorithm;
  // The plan does not depend on the algorithm (ops.cc makes kAuto concrete afterwards, from the plan).
  ASYNCTP_CHECK(a == Algorithm::kSequential || a == Algorithm::kPipelined || a == Algorithm::kFused ||
                    a == Algorithm::kAuto, op,
                ": options.algorithm is ", static_cast<int>(a), "; expected sequential, pipelined, fused or auto");
  const BLayout layout = options.b_layout;
  ASYNCTP_CHECK(layout == BLayout::kRowMajor || layout == BLayout::kColMajor, op, ": options.b_layout is ",
                static_cast<int>(layout), "; expected row-major (0) or col-major (1)");
  ASYNCTP_CHECK(options.chunks_per_rank >= 0 && options.chunks_per_rank <= kMaxChunksPerRank, op,
                ": options.chunks_per_rank is ", options.chunks_per_rank, "; expected 0 (the default) to ",
                kMaxChunksPerRank);
}


AllGatherMatmulPlan plan_typed_all_gather_matmul(const char* op, int world_size, const TensorRef& a,
                                                 const std::vector<TensorRef>& bs, int gather_dim,
                                                 const std::vector<TensorRef>& outputs, const TensorRef& gathered_a,
                                                 const OpOptions& options, const Dtypes& types) {
  check_tensor(op, "a_shard", a, types.a, 2, TensorRef::kMaxDims, types.rule);
  AllGatherMatmulPlan p;
  p.dtype = a.dtype;
  p.b_layout = options.b_layout;
  p.gather_last = normalize_dim(op, "gather_dim", gather_dim, a.ndim) == a.ndim - 1;
  const int64_t rows = a.numel() / a.shape[a.ndim - 1];
  const int64_t a_k = a.shape[a.ndim - 1];
  // Both factors fit in 31 bits here, so the products below fit in 64.
  check_gemm_dim(op, "M", rows, "a_shard's rows");
  check_gemm_dim(op, "K", a_k, "a_shard's last dim");
  p.M = p.gather_last ? rows : rows * world_size;
  p.m_local = rows;
  p.k_local = a_k;
  p.K = p.gather_last ? a_k * world_size : a_k;
  check_gemm_dim(op, "M", p.M, p.gather_last ? "a_shard's rows" : "a_shard's rows x world size");
  check_gemm_dim(op, "K", p.K, p.gather_last ? "a_shard's last dim x world size" : "a_shard's last dim");

  ASYNCTP_CHECK(!bs.empty(), op, ": bs is empty; expected one or more B");
  ASYNCTP_CHECK(outputs.size() == bs.size(), op, ": got ", bs.size(), " B(s) but ", outputs.size(),
                " output(s); expected one output per B");
  const bool col = options.b_layout == BLayout::kColMajor;
  for (size_t i = 0; i < bs.size(); ++i) {
    const std::string name = cat("bs[", i, "]");
    check_tensor(op, name.c_str(), bs[i], types.b, 2, 2, types.rule);
    const int64_t b_k = col ? bs[i].shape[1] : bs[i].shape[0];
    const int64_t n = col ? bs[i].shape[0] : bs[i].shape[1];
    ASYNCTP_CHECK(b_k == p.K, op, ": ", name, " has shape ", shape_string(bs[i]), " (", col ? "[N, K]" : "[K, N]",
                  " for b_layout ", col ? "col-major" : "row-major", ") but A's K is ", p.K,
                  p.gather_last ? cat(" (", a_k, " per rank x ", world_size, " ranks)") : std::string(),
                  "; expected ", col ? cat("[N, ", p.K, "]") : cat("[", p.K, ", N]"));
    p.N.push_back(n);
    check_gemm_dim(op, "N", n, cat(name, "'s N"));
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    const std::string name = cat("outputs[", i, "]");
    check_tensor(op, name.c_str(), outputs[i], types.out, a.ndim, a.ndim, types.rule);
    TensorRef expect = a;
    if (!p.gather_last) expect.shape[0] *= world_size;
    expect.shape[a.ndim - 1] = p.N[i];
    ASYNCTP_CHECK(std::equal(expect.shape, expect.shape + a.ndim, outputs[i].shape), op, ": ", name, " has shape ",
                  shape_string(outputs[i]), "; expected ", shape_string(expect));
    check_no_overlap(op, name.c_str(), outputs[i], "a_shard", a);
    for (size_t j = 0; j < bs.size(); ++j) check_no_overlap(op, name.c_str(), outputs[i], cat("bs[", j, "]").c_str(), bs[j]);
    for (size_t j = 0; j < i; ++j) check_no_overlap(op, name.c_str(), outputs[i], cat("outputs[", j, "]").c_str(), outputs[j]);
  }
  p.return_a = gathered_a.defined();
  if (p.return_a) {
    check_tensor(op, "gathered_a", gathered_a, types.a, a.ndim, a.ndim, types.rule);
    TensorRef expect = a;
    if (p.gather_last) {
      expect.shape[a.ndim - 1] *= world_size;
    } else {
      expect.shape[0] *= world_size;
    }
    ASYNCTP_CHECK(std::equal(expect.shape, expect.shape + a.ndim, gathered_a.shape), op, ": gathered_a has shape ",
                  shape_string(gathered_a), "; expected ", shape_string(expect));
    check_no_overlap(op, "gathered_a", gathered_a, "a_shard", a);
    for (size_t j = 0; j < bs.size(); ++j) check_no_overlap(op, "gathered_a", gathered_a, cat("bs[", j, "]").c_str(), bs[j]);
    for (size_t j = 0; j < outputs.size(); ++j) {
      check_no_overlap(op, "gathered_a", gathered_a, cat("outputs[", j, "]").c_str(), outputs[j]);
    }
  }
  return p;
}

MatmulReduceScatterPlan plan_typed_matmul_reduce_scatter(const char* op, int world_size, const TensorRef& a,
                                                         const TensorRef& b, int scatter_dim, ReduceOp reduce_op,
                                                         const TensorRef& output, const OpOptions& options,
                                                         const Dtypes& types) {
  check_tensor(op, "a", a, types.a, 2, TensorRef::kMaxDims, types.rule);
  check_tensor(op, "b", b, types.b, 2, 2, types.rule);
  MatmulReduceScatterPlan p;
  p.dtype = a.dtype;
  p.b_layout = options.b_layout;
  p.reduce_op = reduce_op;
  p.scatter_last = normalize_dim(op, "scatter_dim", scatter_dim, a.ndim) == a.ndim - 1;
  p.k_local = a.shape[a.ndim - 1];
  p.M = a.numel() / p.k_local;
  const bool col = options.b_layout == BLayout::kColMajor;
  const int64_t b_k = col ? b.shape[1] : b.shape[0];
  p.N = col ? b.shape[0] : b.shape[1];
  ASYNCTP_CHECK(b_k == p.k_local, op, ": b has shape ", shape_string(b), " (", col ? "[N, K/world]" : "[K/world, N]",
                ") but a has K/world = ", p.k_local, "; expected ", col ? cat("[N, ", p.k_local, "]") : cat("[", p.k_local, ", N]"));
  check_gemm_dim(op, "M", p.M, "a's rows");
  check_gemm_dim(op, "N", p.N, "b's N");
  check_gemm_dim(op, "K", p.k_local, "a's last dim");
  TensorRef expect = a;
  expect.shape[a.ndim - 1] = p.N;
  if (p.scatter_last) {
    ASYNCTP_CHECK(p.N % world_size == 0, op, ": N = ", p.N, " is not divisible by the world size ", world_size,
                  "; scatter_dim last needs N % world_size == 0");
    expect.shape[a.ndim - 1] = p.N / world_size;
    p.out_rows = p.M;
    p.out_cols = p.N / world_size;
  } else {
    ASYNCTP_CHECK(a.shape[0] % world_size == 0, op, ": a's dim 0 is ", a.shape[0], " (shape ", shape_string(a),
                  "), not divisible by the world size ", world_size, "; scatter_dim 0 needs it divisible");
    expect.shape[0] /= world_size;
    p.out_rows = p.M / world_size;
    p.out_cols = p.N;
  }
  check_tensor(op, "output", output, types.out, a.ndim, a.ndim, types.rule);
  ASYNCTP_CHECK(std::equal(expect.shape, expect.shape + a.ndim, output.shape), op, ": output has shape ",
                shape_string(output), "; expected ", shape_string(expect));
  check_no_overlap(op, "output", output, "a", a);
  check_no_overlap(op, "output", output, "b", b);
  return p;
}

AllGatherMatmulPlan plan_all_gather_matmul(int world_size, const TensorRef& a, const std::vector<TensorRef>& bs,
                                           int gather_dim, const std::vector<TensorRef>& outputs,
                                           const TensorRef& gathered_a, const OpOptions& options) {
  const char* op = "all_gather_matmul";
  ASYNCTP_CHECK(world_size >= 1, op, ": world size must be >= 1, got ", world_size);
  check_options(op, options);
  check_dtype_supported(op, a.dtype);
  return plan_typed_all_gather_matmul(op, world_size, a, bs, gather_dim, outputs, gathered_a, options, Dtypes{a.dtype, a.dtype, a.dtype, kOneDtype});
}

MatmulReduceScatterPlan plan_matmul_reduce_scatter(int world_size, const TensorRef& a, const TensorRef& b,
                                                   int scatter_dim, ReduceOp reduce_op, const TensorRef& output,
                                                   const OpOptions& options) {
  const char* op = "matmul_reduce_scatter";
  ASYNCTP_CHECK(world_size >= 1, op, ": world size must be >= 1, got ", world_size);
  check_options(op, options);
  ASYNCTP_CHECK(reduce_op == ReduceOp::kSum || reduce_op == ReduceOp::kAvg, op, ": reduce_op is ",
                static_cast<int>(reduce_op), "; expected sum (0) or avg (1)");
  check_dtype_supported(op, a.dtype);
  return plan_typed_matmul_reduce_scatter(op, world_size, a, b, scatter_dim, reduce_op, output, options, Dtypes{a.dtype, a.dtype, a.dtype, kOneDtype});
}

Signature signature_of(const char* op, const TensorRef& a, const std::vector<TensorRef>& bs, int dim,
                       const OpOptions& options, int64_t extra) {
  Signature s;
  s.fields.reserve(16 + 2 * bs.size());  // one allocation: the host time before the kernel is part of the call
  s.add("op", static_cast<int64_t>(std::strlen(op)));  // the two ops' names differ in length
  s.add("dtype", static_cast<int64_t>(a.dtype));
  s.add("algorithm", static_cast<int64_t>(options.algorithm));
  s.add("b_layout", static_cast<int64_t>(options.b_layout));
  s.add("dim", dim < 0 ? dim + a.ndim : dim);
  s.add("a.ndim", a.ndim);
  for (int d = 0; d < TensorRef::kMaxDims; ++d) s.add("a.shape", d < a.ndim ? a.shape[d] : 0);
  s.add("number of B", static_cast<int64_t>(bs.size()));
  for (const TensorRef& b : bs) {
    s.add("B.shape[0]", b.ndim > 0 ? b.shape[0] : 0);
    s.add("B.shape[1]", b.ndim > 1 ? b.shape[1] : 0);
  }
  s.add("reduce_op / return_a", extra);
  s.add("chunks_per_rank", options.chunks_per_rank);
  return s;
}

}  // namespace asynctp::ops
