// Fused matmul_reduce_scatter: one persistent GEMM computes the partial product destination by
// destination (rank me+1's rows first, this rank's own last). Tiles of a peer's rows are staged in
// this GPU's memory and counted; the copy engine pushes each chunk to its destination's inbox as soon
// as its count is complete (or, on request, the kernel stores them into the peer's inbox itself); this
// rank's own tiles wait for the peers' chunks of the same rows and add them in fp32 as the output is
// written (docs/design/fused_matmul_reduce_scatter.md): on two ranks and large problems in the epilogue, otherwise in
// the kernel's fixup().
#include <algorithm>
#include <cstdint>
#include <vector>

#include "algo/bytes.h"
#include "algo/fused.h"
#include "algo/overlap_resources.h"
#include "algo/pipelined.h"
#include "comm/communicator_impl.h"
#include "common/check.h"
#include "common/element.h"
#include "common/env.h"
#include "kernels/fused/fused_gemm.h"
#include "kernels/fused/staged_layout.h"
#include "kernels/fused/tail_split.h"
#include "kernels/scale_product.h"
#include "kernels/sum_partials.h"

namespace asynctp::algo {
namespace {

// Rounds of tiles from which the two-rank reduction runs in the epilogue: there an own tile's
// reduction is cheaper than in fixup(), but a staged tile dearer and the kernel's first round slower,
// and on 2xH200 it measured faster at 6.3 and 31 rounds and slower at 1.7 and 3.4
// (docs/design/fused_matmul_reduce_scatter.md, "Two ways of reducing").
constexpr int64_t kEpilogueFromRounds = 5;

// Whether the reduction runs in the epilogue (two ranks, rows per rank in whole 256-row clusters, which
// its instantiations take, and tiles of at least kEpilogueFromRounds rounds on the SMs the kernel may
// use) or in fixup() (reduce_scatter_tiles.h). ASYNCTP_FUSED_RS_REDUCE=fixup|epilogue overrides the
// rounds' rule for measurement, and must be set alike on every rank (the staged tiles' layout follows
// it); epilogue takes two ranks.
bool reduce_in_epilogue(int world_size, int64_t rows_per_rank, int64_t tiles, int sms) {
  static const int forced = detail::knob_word(detail::Knob::kFusedRsReduce) + 1;  // 0 unset, 1 epilogue, 2 fixup
  if (forced == 1) {
    ASYNCTP_CHECK(world_size == 2, "ASYNCTP_FUSED_RS_REDUCE=epilogue takes two ranks; this communicator has ", world_size);
  }
  if (kernels::fused::reduce_scatter_one_cta(rows_per_rank)) return false;
  if (forced != 0) return forced == 1;
  return world_size == 2 && tiles >= kEpilogueFromRounds * sms;
}

// Rounds of 128 x 128 tiles (one-CTA clusters: rows per rank an odd number of tile rows) up to which the
// fused reduce-scatter runs; beyond, pipelined's cuBLASLt GEMMs measured faster (docs/performance.md,
// "The reduce-scatter at an odd number of tile rows a rank").
constexpr int64_t kOneCtaRounds = 2;

// The staged layout of a reduce-scatter's M x N x k_local partial product on `world_size` ranks with
// `sms` SMs each (`rowwise`: fp8 with row-wise scales): the way of reducing, then the tiles' width
// (kernels::fused::reduce_scatter_tile_n).
kernels::fused::StagedLayout staged_layout_of(int world_size, DType dtype, int64_t M, int64_t N, int64_t k_local,
                                              int sms, bool rowwise) {
  const int64_t rows_per_rank = M / world_size;
  const int64_t tiles = M / kernels::fused::kTileRows * kernels::fused::StagedLayout::tiles_along(N);
  const bool epilogue = reduce_in_epilogue(world_size, rows_per_rank, tiles, sms);
  return kernels::fused::StagedLayout(
      epilogue, N,
      kernels::fused::reduce_scatter_tile_n(epilogue, element_of(dtype), M, N, k_local, rows_per_rank, sms, rowwise));
}

// What the fused reduce-scatter's pushes read from the host: with the peers' inboxes, the key of their
// recorded replay (StreamReplay::key_of), so 64-bit fields only (no padding).
struct PushWork {
  int64_t me, ws, rows, chunk_rows, used_chunks, n, tile_n, epilogue;
  uint64_t rank_bytes;
  const char* staging;  // slot d: this rank's tiles of rank d's rows
};

// Each chunk of each peer's rows, once the kernel has staged all its tiles (the staged counters), to
// that peer's inbox with its arrived flag; rank me+1 first, as the kernel computes them. One stream per
// destination, forked from `origin` and joined back.
void enqueue_pushes_of(OverlapResources& pr, const PushWork& w, const std::vector<const void*>& inboxes,
                       cudaStream_t origin) {
  const kernels::fused::StagedLayout layout(w.epilogue != 0, w.n, w.tile_n);
  kernels::fused::ReduceScatterTiles counts;  // what the kernel counts per chunk
  counts.rows_per_rank = static_cast<int32_t>(w.rows);
  counts.rows_per_chunk = static_cast<int32_t>(w.chunk_rows);
  counts.tiles_n = static_cast<int32_t>(layout.tiles_n);
  const int me = static_cast<int>(w.me), ws = static_cast<int>(w.ws);
  Fanout pushes(pr, origin);
  for (int i = 1; i < ws; ++i) {
    const int d = (me + i) % ws;
    cudaStream_t push = pushes.use(pr.peer_stream(d));
    for (int j = 0; j < w.used_chunks; ++j) {
      const int64_t r0 = j * w.chunk_rows, r1 = std::min<int64_t>(w.rows, (j + 1) * w.chunk_rows);
      pr.wait_staged(push, d, j, layout.count(counts, j));
      const size_t offset = layout.bytes_before(r0);
      ASYNCTP_CUDA_CHECK(cudaMemcpyAsync(bytes(const_cast<void*>(inboxes[d])) + me * w.rank_bytes + offset,
                                         w.staging + d * w.rank_bytes + offset, layout.bytes_before(r1) - offset,
                                         cudaMemcpyDeviceToDevice, push));
      pr.signal(push, d, pr.arrived_flag(me, j));
    }
    pr.zero_staged(push, d, static_cast<int>(w.used_chunks));  // as the next call expects to find them
  }
  pushes.join();
}

// Whether a reduction in the epilogue pushes the staged tiles from the kernel, straight into the
// peer's inbox over NVLink (kernels/fused/reduce_scatter_tiles.h, push_inbox), instead of through the
// staging buffer and the copy engine. ASYNCTP_FUSED_RS_PUSH=kernel|copy-engine, set alike on every
// rank; copy-engine by default: on 2 H200s the kernel's way was 5-11% slower at the large seed shapes
// (docs/design/fused_matmul_reduce_scatter.md, "Pushed from the kernel").
bool push_from_kernel() {
  static const bool kernel = detail::knob_word(detail::Knob::kFusedRsPush) == 1;  // copy-engine|kernel
  return kernel;
}

// The two-rank reduction in the epilogue, pushed from the kernel: nothing but the kernel, which waits
// for the peer's done itself before it stores into the peer's inbox. Under capture (where the host
// does not know the epoch) the epoch kernel runs before it, as for the copy engine's way, and waits too.
void run_pushed_from_kernel(Communicator& comm, OverlapResources& pr, SymmetricBuffer& inbox, size_t rank_bytes,
                            kernels::fused::FusedGemmArgs& g, kernels::fused::CallTimeline& timeline,
                            cudaStream_t stream) {
  kernels::fused::ReduceScatterTiles& rs = g.rs;
  const int me = rs.rank, peer = 1 - rs.rank;
  rs.push_inbox = reinterpret_cast<uint32_t*>(bytes(inbox.peer(peer)) + me * rank_bytes);
  rs.push_count = pr.pad_of(peer) + pr.pushed_count(me, 0);
  rs.pushed = pr.pad() + pr.pushed_count(peer, 0);
  rs.peer_done = pr.pad() + OverlapResources::done_flag(peer);
  rs.push_pad_index = pr.pushed_count(peer, 0);
  timeline.mark("resources");
  pr.begin_call();
  const bool captured = OverlapResources::capturing(stream);
  rs.begin_epoch = pr.begin_epoch_in_kernel(captured);
  if (rs.begin_epoch == 0) pr.begin_fused_epoch(stream, captured);
  attach_tile_trace(g, stream);
  timeline.mark("kernel");
  kernels::fused::run_fused_gemm(g, stream);
  timeline.mark("kernel_launched");
  timeline.mark("end");
  finish_tile_trace(comm, "rs", g, timeline, stream);
}

}  // namespace

int fused_rs_tile_n(int world_size, DType dtype, int64_t M, int64_t N, int64_t k_local, int sms, bool rowwise) {
  return staged_layout_of(world_size, dtype, M, N, k_local, sms, rowwise).tile_n;
}

int resolve_fused_rs_chunks(int requested, int64_t rows_per_rank) {
  const int64_t clusters = std::max<int64_t>(1, rows_per_rank / kernels::fused::kClusterRows);
  // A chunk of at least 512 rows keeps bands of two cluster rows (B reused in L2); up to 4 chunks, so
  // that a rank's first own tiles wait for a quarter of what the peers stage, not for all of it.
  const int64_t chunks = requested > 0 ? requested : std::clamp<int64_t>(rows_per_rank / 512, 1, 4);
  return static_cast<int>(std::min<int64_t>(chunks, clusters));
}

const char* fused_rs_unsupported(const MatmulReduceScatterPlan& plan, const TensorRef& a, const TensorRef& b,
                                 const TensorRef& output, int sms) {
  if (plan.scatter_last) return "scatter_dim last";
  if (!fused_rs_takes_rows(plan.out_rows)) return "rows per rank not a multiple of 128";
  if (kernels::fused::reduce_scatter_one_cta(plan.out_rows)) {
    const int64_t tiles = plan.M / kernels::fused::kTileRows *
                          ((plan.N + kernels::fused::kOneRowTileN - 1) / kernels::fused::kOneRowTileN);
    if (tiles > kOneCtaRounds * sms) return "rows per rank an odd number of 128-row tiles, in more than two rounds of tiles";
  }
  // The kernel's own tiles wait for the peers' pushes, which wait for what the peers' kernels stage:
  // with one hardware queue, the queue holds the pushes behind the kernel that waits for them.
  if (detail::one_device_connection()) return "one hardware queue per device (CUDA_DEVICE_MAX_CONNECTIONS=1)";
  kernels::fused::FusedGemmArgs g;
  g.dtype = element_of(plan.dtype);
  g.b_layout = layout_of(plan.b_layout);
  g.M = plan.M, g.N = plan.N, g.K = plan.k_local;
  g.a = a.data, g.b = b.data, g.c = output.data;
  return kernels::fused::fused_gemm_unsupported(g);
}

namespace {

// The scaled op's inputs beside A and B: its scales (device floats; `rowwise`: one for each of A's M
// rows and B's N columns, else one each), its bias (null: none), and an fp8 output's result scale
// (null: none).
struct FusedRsScaling {
  const float* a_scale = nullptr;
  const float* b_scale = nullptr;
  bool rowwise = false;
  const void* bias = nullptr;
  const float* result_scale = nullptr;
};

// Both ops' body: `scaling` is null for the unscaled op.
void run_fused_rs(Communicator& comm, const MatmulReduceScatterPlan& plan, const TensorRef& a, const TensorRef& b,
                  const TensorRef& output, cudaStream_t stream, const AgreeFn& agree, int chunks_per_rank,
                  const FusedRsScaling* scaling) {
  const float* a_scale = scaling != nullptr ? scaling->a_scale : nullptr;
  const float* b_scale = scaling != nullptr ? scaling->b_scale : nullptr;
  const bool rowwise = scaling != nullptr && scaling->rowwise;
  const void* bias = scaling != nullptr ? scaling->bias : nullptr;
  kernels::fused::CallTimeline timeline(stream);
  timeline.mark("entry");
  agree();
  timeline.mark("agreed");
  Communicator::Impl& m = impl_of(comm);
  const int ws = m.world_size, me = m.rank;
  const int64_t rows = plan.out_rows;
  const float scale = plan.reduce_op == ReduceOp::kAvg ? 1.0f / static_cast<float>(ws) : 1.0f;
  // An fp8 output: the kernel reduces into a bf16 product in scratch (after the rest), rounded to the
  // output, times the result scale, once the call's work is on the stream (round_output).
  const bool fp8_out = scaling != nullptr && plan.scaling.fp8_out();
  const size_t out_bytes = fp8_out ? align_up(static_cast<size_t>(rows * plan.N) * dtype_size(DType::kBF16)) : 0;
  void* out_product = nullptr;
  const auto round_output = [&] {
    if (!fp8_out) return;
    kernels::sum_partials_to(Element::kBF16, {out_product}, element_of(plan.scaling.out_dtype), output.data, rows * plan.N,
                             1.0f, scaling->result_scale, stream);
  };

  kernels::fused::FusedGemmArgs g;
  g.dtype = element_of(plan.dtype);
  if (scaling != nullptr) g.out = element_of(plan.scaling.partial_dtype());
  g.b_layout = layout_of(plan.b_layout);
  g.M = plan.M, g.N = plan.N, g.K = plan.k_local;
  g.a = a.data, g.b = b.data, g.c = output.data;
  g.alpha = scale;
  attach_grid(comm, g, stream);
  // Tensor-wise, the scaled op's a_scale * b_scale, in the scratch after the staged tiles: alone, the
  // kernel's alpha; with peers, what the kernel scales its partial product by before the sum
  // (partial_scale). Row-wise, alone, the epilogue applies the scales (row_scales); with peers, the
  // kernel scales its partial product by them before the sum (rs.row_scales). The bias likewise: alone,
  // the epilogue's; with peers, added to the partial product after its scales (rs.bias).
  const bool tensor_wise = a_scale != nullptr && !rowwise;
  constexpr size_t kProductBytes = 16;
  const auto make_product = [&](char* at) {
    float* product = reinterpret_cast<float*>(at);
    kernels::scale_product(a_scale, b_scale, product, stream);
    return product;
  };
  if (ws == 1) {  // nothing to reduce; the average of one is itself
    char* scratch = static_cast<char*>(m.scratch_for(out_bytes + kProductBytes, stream));
    if (fp8_out) g.c = out_product = scratch;
    if (tensor_wise) g.alpha_ptr = make_product(scratch + out_bytes);
    if (rowwise) g.row_scales = a_scale, g.col_scales = b_scale;
    g.bias = bias;
    kernels::fused::run_fused_gemm(g, stream);
    round_output();
    return;
  }

  OverlapResources& pr = OverlapResources::of(comm, stream);
  kernels::fused::load_fused_gemm_kernels();
  const kernels::fused::StagedLayout layout =
      staged_layout_of(ws, plan.dtype, plan.M, plan.N, plan.k_local, m.sm_budget, rowwise);
  g.tile_n = static_cast<int>(layout.tile_n);
  // The kernel's last warp zeroes the counts it pushes into before it says done (done_signal), which
  // the peer waits for before it pushes again.
  const bool push = layout.epilogue && push_from_kernel() && pr.done_signal() != nullptr;
  const size_t rank_bytes = layout.bytes_before(rows);  // one rank's rows, staged
  // Slot d: this rank's tiles of d's rows (none where the kernel pushes); an fp8 output's bf16 product
  // and the tensor-wise product after them.
  const size_t staging_bytes = push ? 0 : align_up(ws * rank_bytes);
  const size_t scratch_bytes = staging_bytes + out_bytes + (tensor_wise ? kProductBytes : 0);
  char* scratch = scratch_bytes != 0 ? static_cast<char*>(m.scratch_for(scratch_bytes, stream)) : nullptr;
  char* staging = push ? nullptr : scratch;
  if (fp8_out) g.c = out_product = scratch + staging_bytes;
  SymmetricBuffer& inbox = pr.inbox(ws * rank_bytes, stream);  // slot q: rank q's tiles of this rank's rows
  const kernels::fused::RowChunks chunks(rows, resolve_fused_rs_chunks(chunks_per_rank, rows));
  const int64_t chunk_rows = chunks.rows;
  const int used_chunks = chunks.used;

  kernels::fused::ReduceScatterTiles& rs = g.rs;
  rs.rank = me;
  rs.world = ws;
  rs.rows_per_rank = static_cast<int32_t>(rows);
  rs.rows_per_chunk = static_cast<int32_t>(chunk_rows);
  rs.tiles_n = static_cast<int32_t>(layout.tiles_n);
  rs.reduce_in_epilogue = layout.epilogue;
  rs.inbox = reinterpret_cast<const uint32_t*>(inbox.local());
  rs.epoch = pr.epoch();
  rs.epoch_out = pr.epoch_word();
  rs.wait = pr.wait_context();
  if (tensor_wise) rs.partial_scale = make_product(scratch + staging_bytes + out_bytes);
  if (rowwise) rs.row_scales = a_scale, rs.col_scales = b_scale;
  rs.bias = bias;
  if (rowwise || bias != nullptr) rs.cols = static_cast<int32_t>(plan.N);
  g.c_row0 = me * rows;
  g.done = pr.done_signal();
  pr.count_fused_reduction(layout.epilogue, push);

  if (push) {
    run_pushed_from_kernel(comm, pr, inbox, rank_bytes, g, timeline, stream);
    round_output();
    return;
  }

  // Each chunk of each peer's rows, once the kernel has staged all its tiles, to that peer's inbox;
  // rank me+1 first, as the kernel computes them. One stream per destination, forked from `origin`.
  // The pushes read only `work` and the peers' inboxes, which make their replay's key.
  const PushWork work{me, ws, rows, chunk_rows, used_chunks, plan.N, layout.tile_n, layout.epilogue ? 1 : 0, rank_bytes,
                      staging};
  std::vector<const void*> inboxes;
  for (int d = 0; d < ws; ++d) inboxes.push_back(inbox.peer(d));
  const auto enqueue_pushes = [&pr, work, inboxes](cudaStream_t origin) {
    enqueue_pushes_of(pr, work, inboxes, origin);
  };
  timeline.mark("resources");
  pr.begin_call();
  // Outside graph capture the pushes are one graph launch after the kernel (stream_replay.h); the graph
  // is made before the kernel, the first time this layout is used. Where ranks share the GPU they are
  // enqueued one by one instead (OverlapResources::replays_off).
  const bool captured = OverlapResources::capturing(stream);
  cudaGraphExec_t replay = nullptr;
  if (!captured && !pr.replays_off()) {
    replay = pr.replays().prepare(StreamReplay::key_of(ReplayKind::kFusedRsPushes, work, inboxes), stream,
                                  enqueue_pushes);
  }
  // Pushes go into the peers' inboxes, so each peer must be done with the last call first: outside
  // graph capture only the pushes wait for that (docs/design/fused_all_gather_matmul.md), under capture the whole call. Outside
  // capture the kernel starts the epoch itself, without a kernel launched before it.
  timeline.mark("graph_ready");
  const uint32_t begin_epoch = pr.begin_epoch_in_kernel(captured);
  const bool pushes_wait = begin_epoch != 0 || pr.begin_fused_epoch(stream, captured);
  Fanout fan(pr, stream);
  timeline.mark("epoch");

  // The kernel first: the pushes below wait for what it stages, and enqueuing them would otherwise delay
  // its start. The side streams follow the fork recorded above, not the kernel.
  rs.staging = reinterpret_cast<uint32_t*>(staging);
  rs.staged = pr.staged();
  rs.arrived = pr.pad() + pr.arrived_flag(0, 0);
  rs.begin_epoch = begin_epoch;
  rs.flag_stride = kMaxChunksPerRank;
  rs.pad_index = pr.arrived_flag(0, 0);
  attach_tile_trace(g, stream);
  timeline.mark("kernel");
  kernels::fused::run_fused_gemm(g, stream);
  timeline.mark("kernel_launched");

  // From a fork taken before the kernel: the pushes must not wait for the kernel, which waits for them.
  cudaStream_t side = fan.use(pr.signal_stream());
  if (replay == nullptr) {
    if (pushes_wait) pr.wait_previous_done_without_sm(side);
    enqueue_pushes(side);  // into the caller's graph where it is capturing
  } else {
    if (pushes_wait) pr.wait_previous_done_without_sm(side);
    StreamReplay::launch(replay, side);
  }

  timeline.mark("copies_enqueued");
  fan.join();
  // This rank no longer reads its inbox: peers may push again. The kernel has said so itself as it
  // ended, where it could.
  if (g.done == nullptr) {
    for (int i = 1; i < ws; ++i) pr.signal(stream, (me + i) % ws, OverlapResources::done_flag(me));
  }
  round_output();
  timeline.mark("end");
  finish_tile_trace(comm, "rs", g, timeline, stream);
}

}  // namespace

void fused_matmul_reduce_scatter(Communicator& comm, const MatmulReduceScatterPlan& plan, const TensorRef& a,
                                 const TensorRef& b, const TensorRef& output, cudaStream_t stream,
                                 const AgreeFn& agree, int chunks_per_rank) {
  const char* why = fused_rs_unsupported(plan, a, b, output, impl_of(comm).sm_budget);
  ASYNCTP_CHECK(*why == '\0', "fused matmul_reduce_scatter: ", why, "; such a call runs pipelined (ops::algorithm_that_runs)");
  run_fused_rs(comm, plan, a, b, output, stream, agree, chunks_per_rank, nullptr);
}

const char* fused_scaled_rs_unsupported(const MatmulReduceScatterPlan& plan, const TensorRef& a, const TensorRef& b,
                                        const TensorRef& output, int sms) {
  const char* why = fused_scaling_unsupported(plan.scaling, plan.dtype);
  return *why != '\0' ? why : fused_rs_unsupported(plan, a, b, output, sms);
}

void fused_scaled_matmul_reduce_scatter(Communicator& comm, const MatmulReduceScatterPlan& plan, const TensorRef& a,
                                        const TensorRef& b, const TensorRef& a_scale, const TensorRef& b_scale,
                                        const TensorRef& output, const ScaledEpilogue& epilogue, cudaStream_t stream,
                                        const AgreeFn& agree, int chunks_per_rank) {
  const char* why = fused_scaled_rs_unsupported(plan, a, b, output, impl_of(comm).sm_budget);
  ASYNCTP_CHECK(*why == '\0', "fused scaled_matmul_reduce_scatter: ", why, " runs pipelined (ops dispatch)");
  FusedRsScaling scaling;
  scaling.a_scale = static_cast<const float*>(a_scale.data);
  scaling.b_scale = static_cast<const float*>(b_scale.data);
  scaling.rowwise = plan.scaling.rowwise;
  scaling.bias = epilogue.bias.data;
  scaling.result_scale = static_cast<const float*>(epilogue.result_scale.data);
  run_fused_rs(comm, plan, a, b, output, stream, agree, chunks_per_rank, &scaling);
}

}  // namespace asynctp::algo
