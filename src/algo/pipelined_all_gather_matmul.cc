// Pipelined all_gather_matmul: the local shard is multiplied at once while the copy engine pulls the
// peers' shards, chunk by chunk, in an order rotated by rank; each chunk's GEMM starts when it lands.
#include <algorithm>

#include "algo/overlap_resources.h"
#include "algo/pipelined.h"
#include "algo/resources.h"
#include "algo/scaled_work.h"
#include "algo/bytes.h"
#include "comm/communicator_impl.h"
#include "common/check.h"

namespace asynctp::algo {
namespace {

// What a pipelined all_gather_matmul's stream work reads from the host, with `AgRefs`: the key of its
// recorded replay (StreamReplay::key_of), so 64-bit fields only (no padding).
struct AgWork {
  int64_t me, ws, dtype, b_layout, gather_last, return_a;
  int64_t m, k, k_local, shard_rows, chunks;  // m, k: the gathered A's; a shard is [shard_rows, k_local]
  int64_t symmetric_source;                   // the shard is read in place from the caller's symmetric memory
  int64_t out_dtype;                          // the outputs' (A's, unless scaled)
  ScaledWork scaled;                          // the scaled ops' (all zero for the unscaled)
  const char* a;                              // this rank's shard
  char* own_source;                           // where this rank's shard is copied for the peers, unless in place
  char* gathered;                             // the gathered A, [m, k]
  uint64_t source_offset;                     // of the shard in each rank's source buffer
};

// The pointers and sizes of a call, beside AgWork: each rank's source buffer (where peers read its
// shard), then each B and its output, then (scaled) each B's scale, bias and result scale; each B's N.
struct AgRefs {
  // [0, ws): sources; ws + 2i: bs[i]; ws + 2i + 1: outputs[i]; then, scaled, from ws + 2n, three a B:
  // b_scales[i], its bias and its result scale (null where absent)
  std::vector<const void*> pointers;
  std::vector<int64_t> n;
  const char* source(const AgWork& w, int q) const { return bytes(pointers[q]) + w.source_offset; }
  const void* b(const AgWork& w, size_t i) const { return pointers[w.ws + 2 * i]; }
  char* out(const AgWork& w, size_t i) const { return bytes(pointers[w.ws + 2 * i + 1]); }
  // B i's scale, bias and result scale, with `a_scale`.
  gemm::ScaledPointers scaled(const AgWork& w, size_t i, const float* a_scale) const {
    const size_t at = w.ws + 2 * n.size() + 3 * i;
    return gemm::ScaledPointers{a_scale, static_cast<const float*>(pointers[at]), pointers[at + 1],
                                static_cast<const float*>(pointers[at + 2])};
  }
};

// outputs[i] rows [row0, row0 + rows) = (rows of the gathered A starting at `a_rows`) @ bs[i].
void gemm_rows(gemm::GemmRunner& runner, const AgWork& w, const AgRefs& refs, const void* a_rows, int64_t row0,
               int64_t rows, cudaStream_t stream, int lane) {
  if (rows == 0) return;
  const DType dtype = static_cast<DType>(w.dtype);
  const size_t out_es = dtype_size(static_cast<DType>(w.out_dtype));
  for (size_t i = 0; i < refs.n.size(); ++i) {
    gemm::Problem p;
    p.M = rows;
    p.N = refs.n[i];
    p.K = w.k;
    p.dtype = dtype;
    p.b_layout = static_cast<BLayout>(w.b_layout);
    char* out = refs.out(w, i) + static_cast<size_t>(row0) * refs.n[i] * out_es;
    if (w.scaled.on) {
      // Row-wise, a_scale is the gathered A's [M]: these rows' scales start at row0.
      run_scaled_gemm(runner, w.scaled, p, a_rows, refs.b(w, i),
                      refs.scaled(w, i, w.scaled.a_scale + (w.scaled.rowwise ? row0 : 0)), out, stream, lane);
    } else {
      runner.run(p, a_rows, refs.b(w, i), out, stream, lane);
    }
  }
}

// Runner lanes: 0 the caller's stream, then one a GEMM stream.
constexpr int kGemmLanes = OverlapResources::kGemmStreams + 1;

// GEMMs take turns on the pipeline's GEMM streams, so that one's tail overlaps the next one's start.
struct GemmTurns {
  OverlapResources& pr;
  Fanout& fan;
  int next = 0;
  std::pair<cudaStream_t, int> take() {
    const int lane = next;
    next = (next + 1) % OverlapResources::kGemmStreams;
    return {fan.use(pr.gemm_stream(lane)), lane + 1};  // runner lane 0 is the caller's stream
  }
};

// The call's stream work, from `origin`: it reads only `w` and `refs`.
void enqueue_ag_call(OverlapResources& pr, gemm::GemmRunner& runner, const AgWork& w, const AgRefs& refs,
                     cudaStream_t origin) {
  const int me = static_cast<int>(w.me), ws = static_cast<int>(w.ws), chunks = static_cast<int>(w.chunks);
  const size_t es = dtype_size(static_cast<DType>(w.dtype));
  const size_t shard_bytes = static_cast<size_t>(w.shard_rows) * w.k_local * es;
  const size_t row_bytes = static_cast<size_t>(w.k) * es;
  pr.begin_call();
  // A copy into the workspace must wait until the peers have read the last call's; a shard in the
  // caller's symmetric memory is waited for at the end instead (the caller may reuse it after).
  pr.begin_epoch(origin, /*wait_done=*/!w.symmetric_source);
  Fanout fan(pr, origin);
  GemmTurns turns{pr, fan};

  // Offer this rank's shard.
  cudaStream_t offer = fan.use(pr.signal_stream());
  if (!w.symmetric_source) {
    ASYNCTP_CUDA_CHECK(cudaMemcpyAsync(w.own_source, w.a, shard_bytes, cudaMemcpyDeviceToDevice, offer));
  }
  for (int i = 1; i < ws; ++i) pr.signal(offer, (me + i) % ws, pr.ready_flag(me, 0));

  // Pull the peers' shards on one stream, rank me+1 first: at each step every rank reads a different peer.
  cudaStream_t pull = fan.use(pr.peer_stream((me + 1) % ws));
  OverlapResources::FlagList ready;
  for (int i = 1; i < ws; ++i) ready.add(pr.ready_flag((me + i) % ws, 0), (me + i) % ws);
  pr.wait_ready(pull, ready);

  if (!w.gather_last) {
    // The local shard needs no communication: its GEMM starts at once, on the caller's data.
    const auto [local_stream, local_lane] = turns.take();
    gemm_rows(runner, w, refs, w.a, me * w.shard_rows, w.shard_rows, local_stream, local_lane);
    if (w.return_a) {
      ASYNCTP_CUDA_CHECK(cudaMemcpyAsync(w.gathered + me * w.shard_rows * row_bytes, w.a, shard_bytes,
                                         cudaMemcpyDeviceToDevice, offer));
    }
    for (int i = 1; i < ws; ++i) {
      const int q = (me + i) % ws;
      for (int j = 0; j < chunks; ++j) {
        const RowRange r = chunk_rows(w.shard_rows, chunks, j);
        const int64_t row0 = q * w.shard_rows + r.begin;
        ASYNCTP_CUDA_CHECK(cudaMemcpyAsync(w.gathered + row0 * row_bytes, refs.source(w, q) + r.begin * row_bytes,
                                           r.size() * row_bytes, cudaMemcpyDeviceToDevice, pull));
        const cudaEvent_t landed = pr.record(pull);
        const auto [s, lane] = turns.take();
        pr.follow(s, landed);
        gemm_rows(runner, w, refs, w.gathered + row0 * row_bytes, row0, r.size(), s, lane);
      }
    }
  } else {
    // A is sharded along K: every row needs every rank's columns. Rows are cut into chunks; each
    // chunk's columns are pulled from every peer (and copied from the local shard), then multiplied.
    const size_t chunk_bytes = static_cast<size_t>(w.k_local) * es;  // one shard row
    for (int j = 0; j < chunks; ++j) {
      const RowRange r = chunk_rows(w.m, chunks, j);
      if (r.size() == 0) continue;
      char* dst = w.gathered + r.begin * row_bytes;
      ASYNCTP_CUDA_CHECK(cudaMemcpy2DAsync(dst + me * chunk_bytes, row_bytes, w.a + r.begin * chunk_bytes, chunk_bytes,
                                           chunk_bytes, r.size(), cudaMemcpyDeviceToDevice, offer));
      const cudaEvent_t local_done = pr.record(offer);
      for (int i = 1; i < ws; ++i) {
        const int q = (me + i) % ws;
        const char* from = refs.source(w, q) + r.begin * chunk_bytes;
        ASYNCTP_CUDA_CHECK(cudaMemcpy2DAsync(dst + q * chunk_bytes, row_bytes, from, chunk_bytes, chunk_bytes, r.size(),
                                             cudaMemcpyDeviceToDevice, pull));
      }
      const cudaEvent_t landed = pr.record(pull);
      const auto [s, lane] = turns.take();
      pr.follow(s, local_done);
      pr.follow(s, landed);
      gemm_rows(runner, w, refs, dst, r.begin, r.size(), s, lane);
    }
  }
  // Tell each peer its shard has been read.
  for (int i = 1; i < ws; ++i) pr.signal(pull, (me + i) % ws, OverlapResources::done_flag(me));
  fan.join();
  if (w.symmetric_source) pr.wait_done(origin);
}

// The scaled op's tensors beside A, B and the outputs.
struct AgScaled {
  const TensorRef& a_scale;
  const std::vector<TensorRef>& b_scales;
  const std::vector<ScaledEpilogue>& epilogues;
};

// Both ops' entry: `scaled` is set for the scaled op (plan.scaling), null otherwise.
void run_pipelined_ag(Communicator& comm, const AllGatherMatmulPlan& plan, const TensorRef& a_shard,
                      const SymmetricBuffer* a_symmetric, const std::vector<TensorRef>& bs,
                      const std::vector<TensorRef>& outputs, const TensorRef& gathered_a, cudaStream_t stream,
                      const AgreeFn& agree, int chunks_per_rank, const AgScaled* scaled) {
  agree();
  Communicator::Impl& m = impl_of(comm);
  gemm::GemmRunner& runner = Resources::of(comm).gemm;
  const int ws = m.world_size, me = m.rank;
  const size_t es = dtype_size(plan.dtype);
  AgWork w{};
  w.me = me, w.ws = ws;
  w.dtype = static_cast<int64_t>(plan.dtype), w.b_layout = static_cast<int64_t>(plan.b_layout);
  w.out_dtype = static_cast<int64_t>(plan.scaling.scaled ? plan.scaling.out_dtype : plan.dtype);
  w.gather_last = plan.gather_last ? 1 : 0, w.return_a = plan.return_a ? 1 : 0;
  w.m = plan.M, w.k = plan.K, w.k_local = plan.k_local;
  w.shard_rows = plan.m_local;  // a shard is [m_local, k_local] either way
  w.a = bytes(a_shard.data);
  if (scaled != nullptr) {
    w.scaled = ScaledWork::of(plan.scaling, static_cast<const float*>(scaled->a_scale.data), plan.scaling.out_dtype);
  }
  // A GEMM's scales: at most every row of A, or a B's columns.
  const int64_t max_scales = std::max<int64_t>(plan.M, *std::max_element(plan.N.begin(), plan.N.end()));
  const size_t slot_bytes = ScaledWork::slot_bytes(plan.scaling, max_scales, kGemmLanes);
  const size_t shard_bytes = static_cast<size_t>(w.shard_rows) * w.k_local * es;
  AgRefs refs;
  refs.n = plan.N;
  auto add_bs_and_outputs = [&] {
    for (size_t i = 0; i < bs.size(); ++i) {
      refs.pointers.push_back(bs[i].data);
      refs.pointers.push_back(outputs[i].data);
    }
    if (scaled != nullptr) {
      for (size_t i = 0; i < bs.size(); ++i) {
        refs.pointers.push_back(scaled->b_scales[i].data);
        refs.pointers.push_back(scaled->epilogues[i].bias.data);
        refs.pointers.push_back(scaled->epilogues[i].result_scale.data);
      }
    }
  };
  if (ws == 1) {
    refs.pointers.push_back(nullptr);  // no source: nothing is gathered
    add_bs_and_outputs();
    if (slot_bytes) w.scaled.use_slots(m.scratch_for(slot_bytes, stream), max_scales);
    gemm_rows(runner, w, refs, w.a, 0, plan.M, stream, 0);
    if (plan.return_a) {
      ASYNCTP_CUDA_CHECK(cudaMemcpyAsync(gathered_a.data, a_shard.data, shard_bytes, cudaMemcpyDeviceToDevice, stream));
    }
    return;
  }

  OverlapResources& pr = OverlapResources::of(comm, stream);
  // Peers read the shard where the caller keeps it, if that is symmetric memory; else from a copy.
  const SymmetricBuffer* source = a_symmetric ? a_symmetric : &m.workspace_for(comm, shard_bytes, stream);
  w.symmetric_source = a_symmetric ? 1 : 0;
  w.source_offset = a_symmetric ? bytes(a_shard.data) - bytes(a_symmetric->local()) : 0;
  w.own_source = bytes(source->local());
  for (int q = 0; q < ws; ++q) refs.pointers.push_back(source->peer(q));
  add_bs_and_outputs();
  const size_t row_bytes = static_cast<size_t>(plan.K) * es;
  // Scratch: the gathered A unless the caller keeps it, the GEMMs' scale slots, then row-wise scales
  // gathered with A's rows.
  const bool gather_scales = w.scaled.on && plan.scaling.rowwise && plan.scaling.gather_a_scale;
  const size_t gathered_bytes = plan.return_a ? 0 : align_up(static_cast<size_t>(plan.M) * row_bytes);
  const size_t scratch_bytes =
      gathered_bytes + slot_bytes + (gather_scales ? static_cast<size_t>(plan.M) * sizeof(float) : 0);
  char* scratch = scratch_bytes ? static_cast<char*>(m.scratch_for(scratch_bytes, stream)) : nullptr;
  w.gathered = plan.return_a ? bytes(gathered_a.data) : scratch;
  if (slot_bytes) w.scaled.use_slots(scratch + gathered_bytes, max_scales);
  if (gather_scales) {
    // The scales are a few KiB: one collective before the pipeline, in A's row order ([world][m]).
    float* scales = reinterpret_cast<float*>(scratch + gathered_bytes + slot_bytes);
    bound_captured_collective(comm, stream);
    m.transport->all_gather(scaled->a_scale.data, scales, static_cast<size_t>(plan.m_local) * sizeof(float), stream);
    w.scaled.a_scale = scales;
  }
  // Gathered along M: chunks per peer's shard; along K: chunks of all rows.
  w.chunks = plan.gather_last ? ws * resolve_chunks(chunks_per_rank, true, std::max<int64_t>(1, plan.M / ws))
                              : resolve_chunks(chunks_per_rank, false, w.shard_rows);
  // The work reads only `w` and `refs`, which make the key: a later call with the same key launches
  // the graph recorded from it.
  pr.enqueue_call(StreamReplay::key_of(ReplayKind::kPipelinedAg, w, refs.pointers, refs.n), stream,
                  [&pr, &runner, w, refs](cudaStream_t origin) { enqueue_ag_call(pr, runner, w, refs, origin); });
}

}  // namespace

void pipelined_all_gather_matmul(Communicator& comm, const AllGatherMatmulPlan& plan, const TensorRef& a_shard,
                                 const SymmetricBuffer* a_symmetric, const std::vector<TensorRef>& bs,
                                 const std::vector<TensorRef>& outputs, const TensorRef& gathered_a,
                                 cudaStream_t stream, const AgreeFn& agree, int chunks_per_rank) {
  run_pipelined_ag(comm, plan, a_shard, a_symmetric, bs, outputs, gathered_a, stream, agree, chunks_per_rank, nullptr);
}

void pipelined_all_gather_scaled_matmul(Communicator& comm, const AllGatherMatmulPlan& plan, const TensorRef& a_shard,
                                        const std::vector<TensorRef>& bs, const TensorRef& a_scale,
                                        const std::vector<TensorRef>& b_scales, const std::vector<TensorRef>& outputs,
                                        const TensorRef& gathered_a, const std::vector<ScaledEpilogue>& epilogues,
                                        cudaStream_t stream, const AgreeFn& agree, int chunks_per_rank) {
  ASYNCTP_CHECK(plan.scaling.scaled, "pipelined_all_gather_scaled_matmul: the plan is not scaled");
  const AgScaled scaled{a_scale, b_scales, epilogues};
  run_pipelined_ag(comm, plan, a_shard, nullptr, bs, outputs, gathered_a, stream, agree, chunks_per_rank, &scaled);
}

}  // namespace asynctp::algo
