// Pipelined matmul_reduce_scatter: partial products are computed destination by destination (rank
// me+1 first, this rank's own last) into symmetric memory; each destination pulls its chunks with the
// copy engine as soon as they are flagged, while the GEMMs go on. The chunks are summed in fp32 in one
// of two ways (docs/design/pipelined.md compares them):
//  - in the epilogue of this rank's own GEMM (two ranks): own chunk j = A·B + the landed chunk j, so
//    no pass over the output is left after the last GEMM;
//  - by a sum kernel over all ranks' partials, in rank order, once the own partial is done.
#include "algo/overlap_resources.h"
#include "algo/pipelined.h"
#include "algo/resources.h"
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

void pipelined_matmul_reduce_scatter(Communicator& comm, const MatmulReduceScatterPlan& plan, const TensorRef& a,
                                     const TensorRef& b, const TensorRef& output, cudaStream_t stream,
                                     const AgreeFn& agree, int chunks_per_rank, RsSum sum) {
  agree();
  Communicator::Impl& m = impl_of(comm);
  gemm::GemmRunner& runner = Resources::of(comm).gemm;
  const int ws = m.world_size, me = m.rank;
  const size_t es = dtype_size(plan.dtype);
  const bool col = plan.b_layout == BLayout::kColMajor;
  const float scale = plan.reduce_op == ReduceOp::kAvg ? 1.0f / static_cast<float>(ws) : 1.0f;
  // What each destination receives from each rank: a dense [rows, cols] partial product.
  const int64_t rows = plan.out_rows, cols = plan.out_cols;
  const size_t row_bytes = static_cast<size_t>(cols) * es;

  // Rows `r` of the partial product destined for rank d, into `dst` (the start of d's partial);
  // where `addend` is given (the start of a partial like it), dst = scale * (A·B + addend).
  auto partial_gemm = [&](int d, RowRange r, char* dst, cudaStream_t s, int lane, const char* addend) {
    if (r.size() == 0) return;
    gemm::Problem p;
    p.M = r.size();
    p.K = plan.k_local;
    p.dtype = plan.dtype;
    p.b_layout = plan.b_layout;
    if (addend) p.alpha = p.beta = scale;
    const char* a_rows;
    const char* b_cols = bytes(b.data);
    if (!plan.scatter_last) {
      p.N = plan.N;
      a_rows = bytes(a.data) + static_cast<size_t>(d * rows + r.begin) * plan.k_local * es;
    } else {
      // Destination d owns columns [d*cols, (d+1)*cols) of the product: those columns of B.
      p.N = cols;
      p.ldb = col ? plan.k_local : plan.N;
      p.ldc = cols;
      a_rows = bytes(a.data) + static_cast<size_t>(r.begin) * plan.k_local * es;
      b_cols += static_cast<size_t>(d) * cols * (col ? plan.k_local : 1) * es;
    }
    runner.run(p, a_rows, b_cols, dst + r.begin * row_bytes, s, lane, addend ? addend + r.begin * row_bytes : nullptr);
  };
  if (ws == 1) {  // nothing to reduce; the average of one is itself
    partial_gemm(0, RowRange{0, rows}, bytes(output.data), stream, 0, nullptr);
    return;
  }

  OverlapResources& pr = OverlapResources::of(comm, stream);
  const bool in_gemm = resolve_rs_sum(ws, rows, sum) == RsSum::kInGemm;
  const size_t slot_bytes = align_up(static_cast<size_t>(rows) * row_bytes);
  SymmetricBuffer& partials = m.workspace_for(comm, ws * slot_bytes, stream);  // slot d: this rank's partial for rank d
  char* landed = static_cast<char*>(m.scratch_for(ws * slot_bytes, stream));  // slot q: rank q's partial for this rank
  char* own = bytes(partials.local()) + me * slot_bytes;
  // Summed in the GEMM, the own chunk j waits for the landed chunk j: with one chunk the whole pull
  // would be exposed, so two chunks by default.
  const int chunks = resolve_chunks(chunks_per_rank > 0 ? chunks_per_rank : (in_gemm ? 2 : 1), false, rows);

  StreamReplay::Key key = {static_cast<uint64_t>(ReplayKind::kPipelinedRs),
                           static_cast<uint64_t>(plan.dtype),
                           static_cast<uint64_t>(plan.b_layout),
                           static_cast<uint64_t>(plan.scatter_last),
                           static_cast<uint64_t>(plan.reduce_op),
                           static_cast<uint64_t>(plan.N),
                           static_cast<uint64_t>(plan.k_local),
                           static_cast<uint64_t>(rows),
                           static_cast<uint64_t>(cols),
                           static_cast<uint64_t>(in_gemm),
                           static_cast<uint64_t>(chunks),
                           reinterpret_cast<uintptr_t>(a.data),
                           reinterpret_cast<uintptr_t>(b.data),
                           reinterpret_cast<uintptr_t>(output.data),
                           reinterpret_cast<uintptr_t>(landed),
                           reinterpret_cast<uintptr_t>(partials.local()),
                           static_cast<uint64_t>(slot_bytes)};
  for (int q = 0; q < ws; ++q) key.push_back(reinterpret_cast<uintptr_t>(partials.peer(q)));
  // Everything the work below reads from the host is in the key: a later call with the same key
  // launches the graph recorded from it.
  pr.enqueue_call(key, stream, [&](cudaStream_t origin) {
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
        partial_gemm(d, chunk_rows(rows, chunks, j), bytes(partials.local()) + d * slot_bytes, gemm, 1, nullptr);
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
        const RowRange r = chunk_rows(rows, chunks, j);
        ASYNCTP_CUDA_CHECK(cudaMemcpyAsync(landed + q * slot_bytes + r.begin * row_bytes,
                                           bytes(partials.peer(q)) + me * slot_bytes + r.begin * row_bytes,
                                           r.size() * row_bytes, cudaMemcpyDeviceToDevice, pull));
        if (in_gemm) pulled.push_back(pr.record(pull));
      }
      pr.signal(pull, q, OverlapResources::done_flag(me));
    }

    // Step ws: this rank's own partial, last.
    if (in_gemm) {
      const int q = (me + 1) % ws;  // the only peer
      for (int j = 0; j < chunks; ++j) {
        pr.follow(gemm, pulled[j]);
        partial_gemm(me, chunk_rows(rows, chunks, j), bytes(output.data), gemm, 1, landed + q * slot_bytes);
      }
      fan.join();
      return;
    }
    for (int j = 0; j < chunks; ++j) partial_gemm(me, chunk_rows(rows, chunks, j), own, gemm, 1, nullptr);
    fan.join();
    std::vector<const void*> parts;
    for (int q = 0; q < ws; ++q) parts.push_back(q == me ? own : landed + q * slot_bytes);
    kernels::sum_partials(element_of(plan.dtype), parts, output.data, rows * cols, scale, origin);
  });
}

}  // namespace asynctp::algo
