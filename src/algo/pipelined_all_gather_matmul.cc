// Pipelined all_gather_matmul: the local shard is multiplied at once while the copy engine pulls the
// peers' shards, chunk by chunk, in an order rotated by rank; each chunk's GEMM starts when it lands.
#include <algorithm>

#include "algo/overlap_resources.h"
#include "algo/pipelined.h"
#include "algo/resources.h"
#include "algo/bytes.h"
#include "comm/communicator_impl.h"
#include "common/check.h"

namespace asynctp::algo {
namespace {

// outputs[i] rows [row0, row0 + rows) = (rows of the gathered A starting at `a_rows`) @ bs[i].
void gemm_rows(gemm::GemmRunner& runner, const AllGatherMatmulPlan& plan, const void* a_rows, int64_t row0,
               int64_t rows, const std::vector<TensorRef>& bs, const std::vector<TensorRef>& outputs,
               cudaStream_t stream, int lane) {
  if (rows == 0) return;
  const size_t es = dtype_size(plan.dtype);
  for (size_t i = 0; i < bs.size(); ++i) {
    gemm::Problem p;
    p.M = rows;
    p.N = plan.N[i];
    p.K = plan.K;
    p.dtype = plan.dtype;
    p.b_layout = plan.b_layout;
    runner.run(p, a_rows, bs[i].data, bytes(outputs[i].data) + static_cast<size_t>(row0) * plan.N[i] * es, stream,
               lane);
  }
}

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

}  // namespace

void pipelined_all_gather_matmul(Communicator& comm, const AllGatherMatmulPlan& plan, const TensorRef& a_shard,
                                 const SymmetricBuffer* a_symmetric, const std::vector<TensorRef>& bs,
                                 const std::vector<TensorRef>& outputs, const TensorRef& gathered_a,
                                 cudaStream_t stream, const AgreeFn& agree, int chunks_per_rank) {
  agree();
  Communicator::Impl& m = impl_of(comm);
  gemm::GemmRunner& runner = Resources::of(comm).gemm;
  const int ws = m.world_size, me = m.rank;
  const size_t es = dtype_size(plan.dtype);
  const int64_t shard_rows = plan.m_local;  // a shard is [m_local, k_local] either way
  const size_t shard_bytes = static_cast<size_t>(shard_rows) * plan.k_local * es;
  const size_t row_bytes = static_cast<size_t>(plan.K) * es;
  if (ws == 1) {
    gemm_rows(runner, plan, a_shard.data, 0, plan.M, bs, outputs, stream, 0);
    if (plan.return_a) {
      ASYNCTP_CUDA_CHECK(cudaMemcpyAsync(gathered_a.data, a_shard.data, shard_bytes, cudaMemcpyDeviceToDevice, stream));
    }
    return;
  }

  OverlapResources& pr = OverlapResources::of(comm, stream);
  // Peers read the shard where the caller keeps it, if that is symmetric memory; else from a copy.
  const SymmetricBuffer* source = a_symmetric ? a_symmetric : &m.workspace_for(comm, shard_bytes, stream);
  const size_t source_offset = a_symmetric ? bytes(a_shard.data) - bytes(a_symmetric->local()) : 0;
  char* gathered = plan.return_a ? bytes(gathered_a.data)
                                 : static_cast<char*>(m.scratch_for(static_cast<size_t>(plan.M) * row_bytes, stream));
  auto peer_shard = [&](int q) { return bytes(source->peer(q)) + source_offset; };

  // Gathered along M: chunks per peer's shard; along K: chunks of all rows.
  const int chunks = plan.gather_last ? ws * resolve_chunks(chunks_per_rank, true, std::max<int64_t>(1, plan.M / ws))
                                      : resolve_chunks(chunks_per_rank, false, shard_rows);
  StreamReplay::Key key = {static_cast<uint64_t>(ReplayKind::kPipelinedAg),
                           static_cast<uint64_t>(plan.dtype),
                           static_cast<uint64_t>(plan.b_layout),
                           static_cast<uint64_t>(plan.gather_last),
                           static_cast<uint64_t>(plan.return_a),
                           static_cast<uint64_t>(plan.M),
                           static_cast<uint64_t>(plan.K),
                           static_cast<uint64_t>(plan.k_local),
                           static_cast<uint64_t>(shard_rows),
                           static_cast<uint64_t>(chunks),
                           reinterpret_cast<uintptr_t>(a_shard.data),
                           static_cast<uint64_t>(a_symmetric != nullptr),
                           static_cast<uint64_t>(source_offset),
                           reinterpret_cast<uintptr_t>(source->local()),
                           reinterpret_cast<uintptr_t>(gathered)};
  for (int q = 0; q < ws; ++q) key.push_back(reinterpret_cast<uintptr_t>(source->peer(q)));
  for (size_t i = 0; i < bs.size(); ++i) {
    key.push_back(static_cast<uint64_t>(plan.N[i]));
    key.push_back(reinterpret_cast<uintptr_t>(bs[i].data));
    key.push_back(reinterpret_cast<uintptr_t>(outputs[i].data));
  }
  // Everything the work below reads from the host is in the key: a later call with the same key
  // launches the graph recorded from it.
  pr.enqueue_call(key, stream, [&](cudaStream_t origin) {
    pr.begin_call();
    // A copy into the workspace must wait until the peers have read the last call's; a shard in the
    // caller's symmetric memory is waited for at the end instead (the caller may reuse it after).
    pr.begin_epoch(origin, /*wait_done=*/a_symmetric == nullptr);
    Fanout fan(pr, origin);
    GemmTurns turns{pr, fan};

    // Offer this rank's shard.
    cudaStream_t offer = fan.use(pr.signal_stream());
    if (!a_symmetric) {
      ASYNCTP_CUDA_CHECK(cudaMemcpyAsync(source->local(), a_shard.data, shard_bytes, cudaMemcpyDeviceToDevice, offer));
    }
    for (int i = 1; i < ws; ++i) pr.signal(offer, (me + i) % ws, pr.ready_flag(me, 0));

    // Pull the peers' shards on one stream, rank me+1 first: at each step every rank reads a different peer.
    cudaStream_t pull = fan.use(pr.peer_stream((me + 1) % ws));
    OverlapResources::FlagList ready;
    for (int i = 1; i < ws; ++i) ready.add(pr.ready_flag((me + i) % ws, 0), (me + i) % ws);
    pr.wait_ready(pull, ready);

    if (!plan.gather_last) {
      // The local shard needs no communication: its GEMM starts at once, on the caller's data.
      const auto [local_stream, local_lane] = turns.take();
      gemm_rows(runner, plan, a_shard.data, me * shard_rows, shard_rows, bs, outputs, local_stream, local_lane);
      if (plan.return_a) {
        ASYNCTP_CUDA_CHECK(cudaMemcpyAsync(gathered + me * shard_rows * row_bytes, a_shard.data, shard_bytes,
                                           cudaMemcpyDeviceToDevice, offer));
      }
      for (int i = 1; i < ws; ++i) {
        const int q = (me + i) % ws;
        for (int j = 0; j < chunks; ++j) {
          const RowRange r = chunk_rows(shard_rows, chunks, j);
          const int64_t row0 = q * shard_rows + r.begin;
          ASYNCTP_CUDA_CHECK(cudaMemcpyAsync(gathered + row0 * row_bytes, peer_shard(q) + r.begin * row_bytes,
                                             r.size() * row_bytes, cudaMemcpyDeviceToDevice, pull));
          const cudaEvent_t landed = pr.record(pull);
          const auto [s, lane] = turns.take();
          pr.follow(s, landed);
          gemm_rows(runner, plan, gathered + row0 * row_bytes, row0, r.size(), bs, outputs, s, lane);
        }
      }
    } else {
      // A is sharded along K: every row needs every rank's columns. Rows are cut into chunks; each
      // chunk's columns are pulled from every peer (and copied from the local shard), then multiplied.
      const size_t chunk_bytes = static_cast<size_t>(plan.k_local) * es;  // one shard row
      for (int j = 0; j < chunks; ++j) {
        const RowRange r = chunk_rows(plan.M, chunks, j);
        if (r.size() == 0) continue;
        char* dst = gathered + r.begin * row_bytes;
        ASYNCTP_CUDA_CHECK(cudaMemcpy2DAsync(dst + me * chunk_bytes, row_bytes, bytes(a_shard.data) + r.begin * chunk_bytes,
                                             chunk_bytes, chunk_bytes, r.size(), cudaMemcpyDeviceToDevice, offer));
        const cudaEvent_t local_done = pr.record(offer);
        for (int i = 1; i < ws; ++i) {
          const int q = (me + i) % ws;
          ASYNCTP_CUDA_CHECK(cudaMemcpy2DAsync(dst + q * chunk_bytes, row_bytes, peer_shard(q) + r.begin * chunk_bytes,
                                               chunk_bytes, chunk_bytes, r.size(), cudaMemcpyDeviceToDevice, pull));
        }
        const cudaEvent_t landed = pr.record(pull);
        const auto [s, lane] = turns.take();
        pr.follow(s, local_done);
        pr.follow(s, landed);
        gemm_rows(runner, plan, dst, r.begin, r.size(), bs, outputs, s, lane);
      }
    }
    // Tell each peer its shard has been read.
    for (int i = 1; i < ws; ++i) pr.signal(pull, (me + i) % ws, OverlapResources::done_flag(me));
    fan.join();
    if (a_symmetric) pr.wait_done(origin);
  });
}

}  // namespace asynctp::algo
