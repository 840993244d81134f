// Pipelined matmul_reduce_scatter: partial products are computed destination by destination (rank
// me+1 first, this rank's own last) into symmetric memory; each destination pulls its chunks with the
// copy engine as soon as they are flagged, while the GEMMs go on. The chunks are summed in fp32 in one
// of two ways (docs/design/pipelined.md compares them):
//  - in the epilogue of this rank's own GEMM (two ranks): own chunk j = A·B + the landed chunk j, so
//    no pass over the output is left after the last GEMM;
//  - by a sum kernel over all ranks' partials, in rank order, once the own partial is done.
#include <algorithm>

#include "algo/overlap_resources.h"
#include "algo/pipelined.h"
#include "algo/resources.h"
#include "algo/scaled_work.h"
#include "algo/bytes.h"
#include "comm/communicator_impl.h"
#include "common/check.h"
#include "common/element.h"
#include "kernels/sum_partials.h"

namespace asynctp::algo {

RsSum resolve_rs_sum(int world_size, int64_t rows, RsSum requested) {
  if (world_size != 2) return RsSum::kKernel;
  if (requested != RsSum::kDefault) return requested;
  // Summing in the GEMM needs two chunks, which costs GEMM efficiency unless each chunk keeps at least
  // ~2048 rows; below that the sum kernel's pass is cheaper (docs/design/pipelined.md has the figures).
  return rows >= 4096 ? RsSum::kInGemm : RsSum::kKernel;
}

namespace {

// What a pipelined matmul_reduce_scatter's stream work reads from the host: with the peers' partials,
// the key of its recorded replay (StreamReplay::key_of), so 64-bit fields only (no padding).
struct RsWork {
  int64_t me, ws, dtype, b_layout, scatter_last, avg, n, k_local;
  int64_t rows, cols, in_gemm, chunks;  // rows and cols: what each destination receives from each rank
  const char* a;
  const char* b;
  char* output;
  char* landed;    // slot q: rank q's partial for this rank
  char* partials;  // this rank's symmetric partials, slot d: its partial for rank d
  uint64_t slot_bytes;
  int64_t partial_dtype;  // the partials' (A's, unless scaled)
  int64_t out_dtype;      // the output's: the partials', or fp8 for a scaled op's fp8 output
  ScaledWork scaled;      // the scaled op's (all zero for the unscaled); a_scale: A's rows
  const float* b_scale;   // the scaled op's: B's (row-wise, one a column of the product)
  const void* bias;       // the scaled op's, or null: added to every partial
  const float* result_scale;  // the scaled op's fp8 output's, or null
};

size_t partial_row_bytes(const RsWork& w) {
  return static_cast<size_t>(w.cols) * dtype_size(static_cast<DType>(w.partial_dtype));
}

// Rows `r` of the partial product destined for rank d, into `dst` (the start of d's partial); where
// `addend` is given (the start of a partial like it), dst = scale * (A·B + addend).
void partial_gemm(gemm::GemmRunner& runner, const RsWork& w, int d, RowRange r, char* dst, cudaStream_t s, int lane,
                  const char* addend) {
  if (r.size() == 0) return;
  const DType dtype = static_cast<DType>(w.dtype);
  const size_t es = dtype_size(dtype);
  const size_t b_es = w.scaled.on ? dtype_size(static_cast<DType>(w.scaled.b_dtype)) : es;
  const bool col = static_cast<BLayout>(w.b_layout) == BLayout::kColMajor;
  const size_t row_bytes = partial_row_bytes(w);
  gemm::Problem p;
  p.M = r.size();
  p.K = w.k_local;
  p.dtype = dtype;
  p.b_layout = static_cast<BLayout>(w.b_layout);
  if (addend) p.alpha = p.beta = w.avg ? 1.0f / static_cast<float>(w.ws) : 1.0f;
  const char* a_rows;
  const char* b_cols = w.b;
  int64_t a_row0 = r.begin, b_col0 = 0;  // of the scales, row-wise
  if (!w.scatter_last) {
    p.N = w.n;
    a_row0 = d * w.rows + r.begin;
    a_rows = w.a + static_cast<size_t>(a_row0) * w.k_local * es;
  } else {
    // Destination d owns columns [d*cols, (d+1)*cols) of the product: those columns of B.
    p.N = w.cols;
    p.ldb = col ? w.k_local : w.n;
    p.ldc = w.cols;
    a_rows = w.a + static_cast<size_t>(r.begin) * w.k_local * es;
    b_cols += static_cast<size_t>(d) * w.cols * (col ? w.k_local : 1) * b_es;
    b_col0 = d * w.cols;
  }
  if (w.scaled.on) {
    const bool rw = w.scaled.rowwise != 0;
    const size_t bias_es = dtype_size(gemm::bias_dtype(static_cast<DType>(w.out_dtype)));
    const gemm::ScaledPointers ptrs{w.scaled.a_scale + (rw ? a_row0 : 0), w.b_scale + (rw ? b_col0 : 0),
                                    w.bias != nullptr ? bytes(w.bias) + b_col0 * bias_es : nullptr, w.result_scale};
    run_scaled_gemm(runner, w.scaled, p, a_rows, b_cols, ptrs, dst + r.begin * row_bytes, s, lane);
    return;
  }
  runner.run(p, a_rows, b_cols, dst + r.begin * row_bytes, s, lane, addend ? addend + r.begin * row_bytes : nullptr);
}

// The call's stream work, from `origin`: it reads only `w` and the peers' partials (`peer_partials`).
void enqueue_rs_call(OverlapResources& pr, gemm::GemmRunner& runner, const RsWork& w,
                     const std::vector<const void*>& peer_partials, cudaStream_t origin) {
  const int me = static_cast<int>(w.me), ws = static_cast<int>(w.ws), chunks = static_cast<int>(w.chunks);
  const size_t row_bytes = partial_row_bytes(w);
  char* own = w.partials + me * w.slot_bytes;
  pr.begin_call();
  pr.begin_epoch(origin, /*wait_done=*/true);  // the peers have read the last call's partials
  Fanout fan(pr, origin);

  // Steps 1 .. ws-1: the peers' partials, in order on one stream, each chunk flagged when done.
  cudaStream_t gemm = fan.use(pr.gemm_stream(0));
  cudaStream_t flag = fan.use(pr.signal_stream());
  std::vector<cudaEvent_t> computed;  // after this rank's GEMM of (step s, chunk j), at (s - 1) * chunks + j
  for (int s = 1; s < ws; ++s) {
    const int d = (me + s) % ws;
    for (int j = 0; j < chunks; ++j) {
      partial_gemm(runner, w, d, chunk_rows(w.rows, chunks, j), w.partials + d * w.slot_bytes, gemm, 1, nullptr);
      computed.push_back(pr.record(gemm));
      pr.follow(flag, computed.back());
      pr.signal(flag, d, pr.ready_flag(me, j));
    }
  }

  // Rank q computes this rank's partial at its step s, as this rank computes its step s: the wait for
  // it starts once this rank's own step-s GEMM is done. So a wait is short, and it shares the GPU only
  // with GEMMs that no peer waits on at that step: a GEMM whose thread blocks must all be resident at
  // once (cuBLAS may pick one) can be slowed by a wait but never deadlocked across ranks.
  std::vector<cudaEvent_t> pulled;  // (two ranks) after chunk j has landed, at j
  for (int s = 1; s < ws; ++s) {
    const int q = (me - s + ws) % ws;
    cudaStream_t pull = fan.use(pr.peer_stream(q));
    for (int j = 0; j < chunks; ++j) {
      pr.follow(pull, computed[(s - 1) * chunks + j]);
      OverlapResources::FlagList ready;
      ready.add(pr.ready_flag(q, j), q);
      pr.wait_ready(pull, ready);
      const RowRange r = chunk_rows(w.rows, chunks, j);
      ASYNCTP_CUDA_CHECK(cudaMemcpyAsync(w.landed + q * w.slot_bytes + r.begin * row_bytes,
                                         static_cast<const char*>(peer_partials[q]) + me * w.slot_bytes +
                                             r.begin * row_bytes,
                                         r.size() * row_bytes, cudaMemcpyDeviceToDevice, pull));
      if (w.in_gemm) pulled.push_back(pr.record(pull));
    }
    pr.signal(pull, q, OverlapResources::done_flag(me));
  }

  // Step ws: this rank's own partial, last.
  if (w.in_gemm) {
    const int q = (me + 1) % ws;  // the only peer
    for (int j = 0; j < chunks; ++j) {
      pr.follow(gemm, pulled[j]);
      partial_gemm(runner, w, me, chunk_rows(w.rows, chunks, j), w.output, gemm, 1, w.landed + q * w.slot_bytes);
    }
    fan.join();
    return;
  }
  for (int j = 0; j < chunks; ++j) partial_gemm(runner, w, me, chunk_rows(w.rows, chunks, j), own, gemm, 1, nullptr);
  fan.join();
  std::vector<const void*> parts;
  for (int q = 0; q < ws; ++q) parts.push_back(q == me ? own : w.landed + q * w.slot_bytes);
  const float scale = w.avg ? 1.0f / static_cast<float>(ws) : 1.0f;
  kernels::sum_partials_to(element_of(static_cast<DType>(w.partial_dtype)), parts,
                           element_of(static_cast<DType>(w.out_dtype)), w.output, w.rows * w.cols, scale,
                           w.out_dtype != w.partial_dtype ? w.result_scale : nullptr, origin);
}

}  // namespace

namespace {

// The scaled op's tensors beside A, B and the output.
struct RsScaled {
  const TensorRef& a_scale;
  const TensorRef& b_scale;
  const ScaledEpilogue& epilogue;
};

// Both ops' entry: `scaled` is set for the scaled op (plan.scaling), null otherwise.
void run_pipelined_rs(Communicator& comm, const MatmulReduceScatterPlan& plan, const TensorRef& a, const TensorRef& b,
                      const TensorRef& output, cudaStream_t stream, const AgreeFn& agree, int chunks_per_rank,
                      RsSum sum, const RsScaled* scaled) {
  agree();
  Communicator::Impl& m = impl_of(comm);
  gemm::GemmRunner& runner = Resources::of(comm).gemm;
  const int ws = m.world_size, me = m.rank;
  RsWork w{};
  w.me = me, w.ws = ws;
  w.dtype = static_cast<int64_t>(plan.dtype), w.b_layout = static_cast<int64_t>(plan.b_layout);
  w.scatter_last = plan.scatter_last ? 1 : 0, w.avg = plan.reduce_op == ReduceOp::kAvg ? 1 : 0;
  w.n = plan.N, w.k_local = plan.k_local;
  w.rows = plan.out_rows, w.cols = plan.out_cols;
  w.a = bytes(a.data), w.b = bytes(b.data), w.output = bytes(output.data);
  // One rank's partial is its output; more ranks' are summed (an fp8 output's in bf16).
  const DType partial_dtype =
      !plan.scaling.scaled ? plan.dtype : ws == 1 ? plan.scaling.out_dtype : plan.scaling.partial_dtype();
  w.partial_dtype = static_cast<int64_t>(partial_dtype);
  w.out_dtype = static_cast<int64_t>(plan.scaling.scaled ? plan.scaling.out_dtype : plan.dtype);
  if (scaled != nullptr) {
    w.scaled = ScaledWork::of(plan.scaling, static_cast<const float*>(scaled->a_scale.data), partial_dtype);
    w.b_scale = static_cast<const float*>(scaled->b_scale.data);
    w.bias = scaled->epilogue.bias.data;
    w.result_scale = static_cast<const float*>(scaled->epilogue.result_scale.data);
  }
  // A GEMM's scales, row-wise: at most A's rows or B's columns; its lanes: the caller's and one more.
  const int64_t max_scales = std::max(plan.M, plan.N);
  const size_t slot_bytes = ScaledWork::slot_bytes(plan.scaling, max_scales, 2);
  if (ws == 1) {  // nothing to reduce; the average of one is itself
    if (slot_bytes) w.scaled.use_slots(m.scratch_for(slot_bytes, stream), max_scales);
    partial_gemm(runner, w, 0, RowRange{0, w.rows}, w.output, stream, 0, nullptr);
    return;
  }

  OverlapResources& pr = OverlapResources::of(comm, stream);
  const size_t row_bytes = partial_row_bytes(w);
  // The scaled op sums with the kernel: its GEMM adds no source C.
  w.in_gemm = !w.scaled.on && resolve_rs_sum(ws, w.rows, sum) == RsSum::kInGemm ? 1 : 0;
  w.slot_bytes = align_up(static_cast<size_t>(w.rows) * row_bytes);
  SymmetricBuffer& partials = m.workspace_for(comm, ws * w.slot_bytes, stream);
  w.partials = bytes(partials.local());
  w.landed = static_cast<char*>(m.scratch_for(ws * w.slot_bytes + slot_bytes, stream));
  if (slot_bytes) w.scaled.use_slots(w.landed + ws * w.slot_bytes, max_scales);
  // Summed in the GEMM, the own chunk j waits for the landed chunk j: with one chunk the whole pull
  // would be exposed, so two chunks by default.
  w.chunks = resolve_chunks(chunks_per_rank > 0 ? chunks_per_rank : (w.in_gemm ? 2 : 1), false, w.rows);
  std::vector<const void*> peer_partials;
  for (int q = 0; q < ws; ++q) peer_partials.push_back(partials.peer(q));
  // The work reads only `w` and the peers' partials, which make the key: a later call with the same
  // key launches the graph recorded from it.
  pr.enqueue_call(StreamReplay::key_of(ReplayKind::kPipelinedRs, w, peer_partials), stream,
                  [&pr, &runner, w, peer_partials](cudaStream_t origin) {
                    enqueue_rs_call(pr, runner, w, peer_partials, origin);
                  });
}

}  // namespace

void pipelined_matmul_reduce_scatter(Communicator& comm, const MatmulReduceScatterPlan& plan, const TensorRef& a,
                                     const TensorRef& b, const TensorRef& output, cudaStream_t stream,
                                     const AgreeFn& agree, int chunks_per_rank, RsSum sum) {
  run_pipelined_rs(comm, plan, a, b, output, stream, agree, chunks_per_rank, sum, nullptr);
}

void pipelined_scaled_matmul_reduce_scatter(Communicator& comm, const MatmulReduceScatterPlan& plan,
                                            const TensorRef& a, const TensorRef& b, const TensorRef& a_scale,
                                            const TensorRef& b_scale, const TensorRef& output,
                                            const ScaledEpilogue& epilogue, cudaStream_t stream, const AgreeFn& agree,
                                            int chunks_per_rank) {
  ASYNCTP_CHECK(plan.scaling.scaled, "pipelined_scaled_matmul_reduce_scatter: the plan is not scaled");
  const RsScaled scaled{a_scale, b_scale, epilogue};
  run_pipelined_rs(comm, plan, a, b, output, stream, agree, chunks_per_rank, RsSum::kKernel, &scaled);
}

}  // namespace asynctp::algo
