#include "soak/calls.h"

#include "common/check.h"

namespace asynctp::soak {
namespace {

int64_t uniform(std::mt19937_64& rng, int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

bool chance(std::mt19937_64& rng, int percent) { return uniform(rng, 0, 99) < percent; }

// Rows per rank along dim 0: in `percent` of the draws a multiple of `multiple`, else any count.
int64_t rows_per_rank(std::mt19937_64& rng, int ws, int64_t max_dim, int percent, int64_t multiple) {
  return chance(rng, percent) ? multiple * uniform(rng, 1, max_dim / (multiple * ws)) : uniform(rng, 1, max_dim / ws);
}

}  // namespace

Call draw_call(std::mt19937_64& rng, bool ag, int ws, int64_t max_dim) {
  ASYNCTP_CHECK(max_dim % (8 * ws) == 0 && max_dim >= 256 * ws, "asynctp-soak: --max-dim ", max_dim,
                " must be a multiple of 8 x world size (", 8 * ws, ") and at least 256 x world size (", 256 * ws,
                ")");
  Call c;
  c.ag = ag;
  c.dtype = chance(rng, 50) ? DType::kBF16 : DType::kFP16;
  c.b_layout = chance(rng, 50) ? BLayout::kRowMajor : BLayout::kColMajor;
  c.last_dim = chance(rng, 25);
  // Dims that are the contiguous last dim of some tensor are multiples of 8 (16-byte rows).
  const int64_t eighths = max_dim / 8;
  c.N = 8 * uniform(rng, 1, eighths - 1);  // a second B is 8 wider
  if (ag) {
    c.num_b = chance(rng, 30) ? 2 : 1;
    c.return_a = chance(rng, 25);
    if (c.last_dim) {
      c.M = uniform(rng, 1, max_dim);
      c.K = 8 * ws * uniform(rng, 1, eighths / ws);
    } else {
      c.M = rows_per_rank(rng, ws, max_dim, 33, 128) * ws;
      c.K = 8 * uniform(rng, 1, eighths);
    }
  } else {
    c.reduce = chance(rng, 50) ? ReduceOp::kSum : ReduceOp::kAvg;
    c.K = 8 * ws * uniform(rng, 1, eighths / ws);
    if (c.last_dim) {
      c.M = uniform(rng, 1, max_dim);
      c.N = 8 * ws * uniform(rng, 1, eighths / ws);
    } else {
      c.M = rows_per_rank(rng, ws, max_dim, 50, 256) * ws;
    }
  }
  return c;
}

std::string describe(const Call& c) {
  return detail::cat(c.ag ? "all_gather_matmul" : "matmul_reduce_scatter", " M=", c.M, " N=", c.N, " K=", c.K, " ",
                     dtype_name(c.dtype), c.b_layout == BLayout::kColMajor ? " B=col" : " B=row",
                     c.last_dim ? " dim=last" : " dim=0",
                     c.ag ? detail::cat(" bs=", c.num_b, c.return_a ? " return_a" : "")
                          : std::string(c.reduce == ReduceOp::kAvg ? " avg" : " sum"));
}

int64_t max_elements(int64_t max_dim) { return max_dim * (max_dim + 8); }

Tensors tensors_of(const Call& c, int rank, int ws, void* a, void* const b[2], void* const out[2], void* gathered) {
  Tensors t;
  t.dim = c.last_dim ? -1 : 0;
  const bool col = c.b_layout == BLayout::kColMajor;
  if (c.ag) {
    const int64_t a_rows = c.last_dim ? c.M : c.M / ws, a_cols = c.last_dim ? c.K / ws : c.K;
    t.a = TensorRef::dense(a, c.dtype, {a_rows, a_cols});
    for (int i = 0; i < c.num_b; ++i) {
      const int64_t n = c.N + 8 * i;
      t.bs.push_back(col ? TensorRef::dense(b[i], c.dtype, {n, c.K}) : TensorRef::dense(b[i], c.dtype, {c.K, n}));
      t.outs.push_back(TensorRef::dense(out[i], c.dtype, {c.M, n}));
    }
    if (c.return_a) t.gathered = TensorRef::dense(gathered, c.dtype, {c.M, c.K});
    t.out_rows = c.M;
    t.out_cols = c.N;
  } else {
    const int64_t kl = c.K / ws;
    t.a = TensorRef::dense(a, c.dtype, {c.M, kl});
    t.bs.push_back(col ? TensorRef::dense(b[0], c.dtype, {c.N, kl}) : TensorRef::dense(b[0], c.dtype, {kl, c.N}));
    t.out_rows = c.last_dim ? c.M : c.M / ws;
    t.out_cols = c.last_dim ? c.N / ws : c.N;
    t.out_row0 = c.last_dim ? 0 : rank * t.out_rows;
    t.out_col0 = c.last_dim ? rank * t.out_cols : 0;
    t.outs.push_back(TensorRef::dense(out[0], c.dtype, {t.out_rows, t.out_cols}));
  }
  return t;
}

}  // namespace asynctp::soak
