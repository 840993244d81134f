// Fused all_gather_matmul: copy-engine pushes into the peers' gathered buffers, one flag per chunk,
// and a persistent GEMM that waits for each tile's rows itself (kernels/fused/).
#include <algorithm>
#include <exception>

#include "algo/bytes.h"
#include "algo/fused.h"
#include "algo/overlap_resources.h"
#include "algo/pipelined.h"
#include "algo/resources.h"
#include "algo/scaled_work.h"
#include "comm/communicator_impl.h"
#include "common/check.h"
#include "common/element.h"
#include "common/env.h"
#include "kernels/fused/fused_gemm.h"
#include "kernels/fused/shard_rows.h"
#include "kernels/scale_product.h"
#include "kernels/sum_partials.h"

namespace asynctp::algo {

int resolve_fused_chunks(int requested, int64_t rows_per_rank) {
  const int chunks = requested > 0 ? requested : kFusedDefaultChunks;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(chunks, rows_per_rank)));
}

void attach_grid(Communicator& comm, kernels::fused::FusedGemmArgs& g, cudaStream_t stream) {
  Communicator::Impl& m = impl_of(comm);
  g.sms = m.sm_budget;
  Resources& r = Resources::of(comm);
  g.split_workspace = r.tail_split_workspace(stream);
  g.split_sms = r.tail_split_sms();
  g.split_wait = kernels::WaitContext{m.fault, timeout_ns(comm), m.rank};
}

void attach_tile_trace(kernels::fused::FusedGemmArgs& g, cudaStream_t stream) {
  g.trace = kernels::fused::tile_trace_buffer(g, stream);
}

void finish_tile_trace(Communicator& comm, const char* op, const kernels::fused::FusedGemmArgs& g,
                       kernels::fused::CallTimeline& timeline, cudaStream_t stream) {
  if (g.trace == nullptr) return;
  comm.synchronize(stream);
  kernels::fused::write_tile_trace(op, g, comm.rank());
  timeline.write(op, g, comm.rank());
}

namespace {

// The scaled op's scales: a_scale and each B's. Tensor-wise, each B's alpha (their product), made in
// scratch once the ranks agree; row-wise, every row's a_scale: a_scale itself, or where it holds this
// rank's rows only (gather_a), the copy gathered after the rows in the symmetric buffer. And each B's
// bias, null where it has none, and for an fp8 output each B's result scale (null: none).
struct FusedScales {
  const float* a_scale = nullptr;
  std::vector<const float*> b_scales;
  std::vector<const void*> biases;
  std::vector<const float*> result_scales;
  bool rowwise = false, gather_a = false;
  float* alphas = nullptr;
  const float* a_rows = nullptr;
};

kernels::fused::FusedGemmArgs gemm_args(Communicator& comm, const AllGatherMatmulPlan& plan, const void* a,
                                     const TensorRef& b, const TensorRef& c, size_t i, const FusedScales* scales,
                                     cudaStream_t stream) {
  kernels::fused::FusedGemmArgs g;
  if (scales != nullptr && scales->rowwise) {
    g.row_scales = scales->a_rows;
    g.col_scales = scales->b_scales[i];
  } else if (scales != nullptr) {
    g.alpha_ptr = scales->alphas + i;
  }
  if (scales != nullptr) g.bias = scales->biases[i];
  g.dtype = element_of(plan.dtype);
  if (scales != nullptr) g.out = element_of(plan.scaling.partial_dtype());
  g.b_layout = layout_of(plan.b_layout);
  g.M = plan.M;
  g.N = plan.N[i];
  g.K = plan.K;
  g.a = a;
  g.b = b.data;
  g.c = c.data;
  attach_grid(comm, g, stream);
  return g;
}

// c = a @ bs[i] with cuBLASLt, where the fused kernel cannot take the problem.
void cublas_gemm(gemm::GemmRunner& runner, const AllGatherMatmulPlan& plan, const void* a, const TensorRef& b,
                 const TensorRef& c, size_t i, const FusedScales* scales, cudaStream_t stream) {
  gemm::Problem p{plan.M, plan.N[i], plan.K, plan.dtype, plan.b_layout};
  if (scales != nullptr) {
    const float* a_scale = scales->rowwise ? scales->a_rows : scales->a_scale;  // aligned, as the plan checks
    // An fp8 output's product is bf16 here, rounded to the output with its result scale after.
    run_scaled_gemm(runner, ScaledWork::of(plan.scaling, a_scale, plan.scaling.partial_dtype()), p, a, b.data,
                    gemm::ScaledPointers{a_scale, scales->b_scales[i], scales->biases[i]}, c.data, stream, 0);
    return;
  }
  runner.run(p, a, b.data, c.data, stream);
}

}  // namespace

namespace {

// Both ops' body: `scales` is set for the scaled op (fast accumulation), null otherwise.
void run_fused_ag(Communicator& comm, const AllGatherMatmulPlan& plan, const TensorRef& a_shard,
                  const std::vector<TensorRef>& bs, const std::vector<TensorRef>& outputs, const TensorRef& gathered_a,
                  cudaStream_t stream, const AgreeFn& agree, int chunks_per_rank, FusedScales* scales) {
  ASYNCTP_CHECK(!plan.gather_last, "fused all_gather_matmul: gather along the last dim runs pipelined "
                "(ops::algorithm_that_runs)");
  kernels::fused::CallTimeline timeline(stream);
  timeline.mark("entry");
  agree();
  timeline.mark("agreed");
  // What each B's GEMM writes: its output, or for an fp8 output a bf16 product in scratch (ahead of the
  // alphas), rounded to the output, times its result scale, once the call's work is on the stream
  // (round_outputs).
  const bool fp8_out = scales != nullptr && plan.scaling.fp8_out();
  std::vector<TensorRef> results = outputs;
  const auto product_bytes = [&](size_t i) {
    return align_up(static_cast<size_t>(plan.M * plan.N[i]) * dtype_size(DType::kBF16));
  };
  size_t products = 0;
  for (size_t i = 0; fp8_out && i < bs.size(); ++i) products += product_bytes(i);
  const size_t alpha_bytes = scales != nullptr && !scales->rowwise ? bs.size() * sizeof(float) : 0;
  if (products + alpha_bytes > 0) {
    char* scratch = static_cast<char*>(impl_of(comm).scratch_for(products + alpha_bytes, stream));
    for (size_t i = 0, at = 0; fp8_out && i < bs.size(); at += product_bytes(i), ++i) {
      results[i] = TensorRef::dense(scratch + at, DType::kBF16, {plan.M, plan.N[i]});
    }
    if (alpha_bytes > 0) {
      scales->alphas = reinterpret_cast<float*>(scratch + products);
      for (size_t i = 0; i < bs.size(); ++i) {
        kernels::scale_product(scales->a_scale, scales->b_scales[i], scales->alphas + i, stream);
      }
    }
  }
  const auto round_outputs = [&] {
    for (size_t i = 0; fp8_out && i < bs.size(); ++i) {
      kernels::sum_partials_to(Element::kBF16, {results[i].data}, element_of(plan.scaling.out_dtype), outputs[i].data,
                               plan.M * plan.N[i], 1.0f, scales->result_scales[i], stream);
    }
  };
  if (scales != nullptr && scales->rowwise) scales->a_rows = scales->a_scale;  // unless gathered, below
  Communicator::Impl& m = impl_of(comm);
  const int ws = m.world_size, me = m.rank;
  const size_t es = dtype_size(plan.dtype);
  const int64_t rows = plan.m_local;
  const size_t row_bytes = static_cast<size_t>(plan.K) * es;
  const size_t shard_bytes = static_cast<size_t>(rows) * row_bytes;

  if (ws == 1) {
    for (size_t i = 0; i < bs.size(); ++i) {
      kernels::fused::FusedGemmArgs g = gemm_args(comm, plan, a_shard.data, bs[i], results[i], i, scales, stream);
      if (*kernels::fused::fused_gemm_unsupported(g) == '\0') {
        kernels::fused::run_fused_gemm(g, stream);
      } else {
        cublas_gemm(Resources::of(comm).gemm, plan, a_shard.data, bs[i], results[i], i, scales, stream);
      }
    }
    round_outputs();
    if (plan.return_a) {
      ASYNCTP_CUDA_CHECK(cudaMemcpyAsync(gathered_a.data, a_shard.data, shard_bytes, cudaMemcpyDeviceToDevice, stream));
    }
    return;
  }

  OverlapResources& pr = OverlapResources::of(comm, stream);
  kernels::fused::load_fused_gemm_kernels();
  // The gathered rows, and after them, where row-wise scales travel with their rows, every row's scale.
  const bool gather_scales = scales != nullptr && scales->gather_a;
  const size_t rows_bytes = align_up(static_cast<size_t>(plan.M) * row_bytes);
  SymmetricBuffer& gathered =
      pr.inbox(rows_bytes + (gather_scales ? static_cast<size_t>(plan.M) * sizeof(float) : 0), stream);
  char* mine = bytes(gathered.local());
  const auto scales_in = [&](const void* buffer) { return reinterpret_cast<float*>(bytes(const_cast<void*>(buffer)) + rows_bytes); };
  if (gather_scales) scales->a_rows = scales_in(gathered.local());
  const int chunks = resolve_fused_chunks(chunks_per_rank, rows);
  const int64_t chunk_rows = (rows + chunks - 1) / chunks;
  const int used_chunks = static_cast<int>((rows + chunk_rows - 1) / chunk_rows);
  auto chunk = [&](int j) { return RowRange{j * chunk_rows, std::min<int64_t>(rows, (j + 1) * chunk_rows)}; };

  // Each B's kernel, or where the kernel cannot take the problem on this rank, cuBLAS once every
  // chunk is in (a local choice: the peers' side of the protocol is the same either way).
  std::vector<kernels::fused::FusedGemmArgs> kernels_args;
  bool all_kernel = true;
  for (size_t i = 0; i < bs.size(); ++i) {
    kernels_args.push_back(gemm_args(comm, plan, mine, bs[i], results[i], i, scales, stream));
    all_kernel = all_kernel && *kernels::fused::fused_gemm_unsupported(kernels_args.back()) == '\0';
  }
  // The kernel reads this rank's rows from the caller's tensor (which the plan has checked is 16-byte
  // aligned, as TMA needs); rows of a tile that also holds a neighbour's rows come from the gathered
  // buffer, and so do all rows for cuBLASLt.
  const int64_t begin = me * rows, end = begin + rows;
  const bool straddles = kernels::fused::shard_straddles_tiles(begin, end, plan.M);
  const bool own_rows_in_gathered = !all_kernel || straddles;

  pr.begin_call();
  if (all_kernel) pr.count_fused_gather();
  // This rank pushes into its peers' gathered buffers, so each peer must be done with the last call
  // first. Outside graph capture only the pushes wait for that, on their stream and without an SM, so
  // the GEMM starts on this rank's own rows at once; under capture the whole call waits (docs/design/fused_all_gather_matmul.md).
  const bool pushes_wait = pr.begin_fused_epoch(stream, OverlapResources::capturing(stream));
  if (gather_scales) {  // this rank's rows' scales, before the kernel that reads them with its own rows
    ASYNCTP_CUDA_CHECK(cudaMemcpyAsync(scales_in(gathered.local()) + begin, scales->a_scale, rows * sizeof(float),
                                       cudaMemcpyDeviceToDevice, stream));
  }
  Fanout fan(pr, stream);

  // Should a launch fail, the copies are still enqueued and the call still ends as usual before the
  // error goes up, so the peers get this rank's rows and do not wait for it until they time out.
  std::exception_ptr launch_failed;
  const auto launch_kernels = [&] {
    timeline.mark("kernel");
    if (!all_kernel) return;
    try {
      for (size_t i = 0; i < bs.size(); ++i) {
        kernels::fused::FusedGemmArgs& g = kernels_args[i];
        g.a_local = a_shard.data;
        g.local_begin = begin;
        g.local_end = end;
        if (i == 0) {  // later kernels run after the first has seen every flag
          g.chunks.flags = pr.pad() + pr.arrived_flag(0, 0);
          g.chunks.epoch = pr.epoch();
          g.chunks.flag_stride = kMaxChunksPerRank;
          g.chunks.rows_per_rank = static_cast<int32_t>(rows);
          g.chunks.rows_per_chunk = static_cast<int32_t>(chunk_rows);
          g.chunks.pad_index = pr.arrived_flag(0, 0);
          g.chunks.wait = pr.wait_context();
          attach_tile_trace(g, stream);
        }
        // The last kernel reads the gathered buffer last; it can tell the peers it is done unless copies
        // of return_a still read the buffer after it.
        if (i + 1 == bs.size() && !plan.return_a) g.done = pr.done_signal();
        kernels::fused::run_fused_gemm(g, stream);
      }
    } catch (...) {
      launch_failed = std::current_exception();
    }
    timeline.mark("kernel_launched");
  };

  const auto enqueue_copies = [&] {
    // Push this rank's shard to each peer, chunk by chunk, rank me-1 first: it multiplies these rows
    // right after its own, while rank me-i multiplies them i-th.
    cudaStream_t push = fan.use(pr.peer_stream(me));
    if (pushes_wait) pr.wait_previous_done_without_sm(push);
    for (int i = 1; i < ws; ++i) {
      const int q = (me - i + ws) % ws;
      char* dst = bytes(gathered.peer(q)) + begin * row_bytes;
      if (gather_scales) {  // ahead of the first chunk's flag: a tile reads its rows' scales once they are in
        ASYNCTP_CUDA_CHECK(cudaMemcpyAsync(scales_in(gathered.peer(q)) + begin, scales->a_scale, rows * sizeof(float),
                                           cudaMemcpyDeviceToDevice, push));
      }
      for (int j = 0; j < used_chunks; ++j) {
        const RowRange r = chunk(j);
        ASYNCTP_CUDA_CHECK(cudaMemcpyAsync(dst + r.begin * row_bytes, bytes(a_shard.data) + r.begin * row_bytes,
                                           r.size() * row_bytes, cudaMemcpyDeviceToDevice, push));
        pr.signal(push, q, pr.arrived_flag(me, j));
      }
    }
    if (!own_rows_in_gathered && !plan.return_a) return;  // nothing for a second stream: no fork to join
    // This rank's own rows, where the GEMM reads them from the gathered buffer.
    cudaStream_t local = fan.use(pr.signal_stream());
    if (own_rows_in_gathered) {
      ASYNCTP_CUDA_CHECK(cudaMemcpyAsync(mine + begin * row_bytes, a_shard.data, shard_bytes, cudaMemcpyDeviceToDevice, local));
      for (int j = 0; j < used_chunks; ++j) pr.signal(local, me, pr.arrived_flag(me, j));
    }
    if (plan.return_a) {
      char* out = bytes(gathered_a.data);
      ASYNCTP_CUDA_CHECK(cudaMemcpyAsync(out + begin * row_bytes, a_shard.data, shard_bytes, cudaMemcpyDeviceToDevice, local));
      // The peers' rows, once all have landed: a one-warp wait, which finds an SM only when the kernel
      // ends (the kernel fills them all), so the copy never delays the GEMM.
      OverlapResources::FlagList landed;
      for (int i = 1; i < ws; ++i) {
        for (int j = 0; j < used_chunks; ++j) landed.add(pr.arrived_flag((me + i) % ws, j), (me + i) % ws);
      }
      pr.wait_ready(local, landed);
      if (begin > 0) ASYNCTP_CUDA_CHECK(cudaMemcpyAsync(out, mine, begin * row_bytes, cudaMemcpyDeviceToDevice, local));
      if (end < plan.M) {
        ASYNCTP_CUDA_CHECK(cudaMemcpyAsync(out + end * row_bytes, mine + end * row_bytes, (plan.M - end) * row_bytes,
                                           cudaMemcpyDeviceToDevice, local));
      }
    }
  };

  // The kernels first, where each stream has a hardware queue of its own: each API call enqueued
  // before them would delay their start on an idle GPU, and the copies need no kernel (their side
  // streams follow the fork above, not the kernels). The copies go first where the device has one
  // queue for every stream (CUDA_DEVICE_MAX_CONNECTIONS=1: the queue would hold them behind the
  // kernel that waits for them), and where ranks share the GPU: a kernel launched before this rank's
  // own rows are enqueued waits for this thread's next API calls, and one of those can wait for the
  // GPU to go idle while another rank's thread frees memory or synchronizes the device. And where no
  // tile lies within this rank's rows (fewer than a tile's a rank), the kernel can start nothing before
  // the peers' rows land, while the pushes leave later by the kernel's launch.
  if (detail::one_device_connection() || pr.ranks_share_device() || rows < kernels::fused::kTileRows) {
    enqueue_copies();
    launch_kernels();
  } else {
    launch_kernels();
    enqueue_copies();
  }

  if (!all_kernel) {
    OverlapResources::FlagList all;
    for (int q = 0; q < ws; ++q) {
      for (int j = 0; j < used_chunks; ++j) all.add(pr.arrived_flag(q, j), q);
    }
    pr.wait_ready(stream, all);
    for (size_t i = 0; i < bs.size(); ++i) {
      cublas_gemm(Resources::of(comm).gemm, plan, mine, bs[i], results[i], i, scales, stream);
    }
  }
  timeline.mark("copies_enqueued");
  fan.join();
  // This rank no longer reads its gathered buffer: peers may push the next call's chunks. The last
  // kernel has said so itself as it ended, where it could (and was launched).
  const bool kernel_signals = all_kernel && !launch_failed && kernels_args.back().done != nullptr;
  if (!kernel_signals) {
    for (int i = 1; i < ws; ++i) pr.signal(stream, (me + i) % ws, OverlapResources::done_flag(me));
  }
  if (launch_failed) {
    pr.end_call();  // the pushes and the done signal above complete what the peers wait for
    std::rethrow_exception(launch_failed);
  }
  round_outputs();
  timeline.mark("end");
  if (all_kernel) finish_tile_trace(comm, "ag", kernels_args[0], timeline, stream);
}

}  // namespace

void fused_all_gather_matmul(Communicator& comm, const AllGatherMatmulPlan& plan, const TensorRef& a_shard,
                             const std::vector<TensorRef>& bs, const std::vector<TensorRef>& outputs,
                             const TensorRef& gathered_a, cudaStream_t stream, const AgreeFn& agree,
                             int chunks_per_rank) {
  run_fused_ag(comm, plan, a_shard, bs, outputs, gathered_a, stream, agree, chunks_per_rank, nullptr);
}

const char* fused_scaled_unsupported(const AllGatherMatmulPlan& plan) {
  if (plan.gather_last) return "gathered along the last dim";
  return fused_scaling_unsupported(plan.scaling, plan.dtype);
}

void fused_all_gather_scaled_matmul(Communicator& comm, const AllGatherMatmulPlan& plan, const TensorRef& a_shard,
                                    const std::vector<TensorRef>& bs, const TensorRef& a_scale,
                                    const std::vector<TensorRef>& b_scales, const std::vector<TensorRef>& outputs,
                                    const TensorRef& gathered_a, const std::vector<ScaledEpilogue>& epilogues,
                                    cudaStream_t stream, const AgreeFn& agree, int chunks_per_rank) {
  const char* why = fused_scaled_unsupported(plan);
  ASYNCTP_CHECK(*why == '\0', "fused all_gather_scaled_matmul: ", why, " runs pipelined (ops dispatch)");
  ASYNCTP_CHECK(epilogues.size() == bs.size(), "fused all_gather_scaled_matmul: ", epilogues.size(),
                " epilogues for ", bs.size(), " Bs");
  FusedScales scales;
  scales.a_scale = static_cast<const float*>(a_scale.data);
  for (const TensorRef& b_scale : b_scales) scales.b_scales.push_back(static_cast<const float*>(b_scale.data));
  for (const ScaledEpilogue& e : epilogues) {
    scales.biases.push_back(e.bias.data);
    scales.result_scales.push_back(static_cast<const float*>(e.result_scale.data));
  }
  scales.rowwise = plan.scaling.rowwise;
  scales.gather_a = plan.scaling.gather_a_scale && comm.world_size() > 1;
  run_fused_ag(comm, plan, a_shard, bs, outputs, gathered_a, stream, agree, chunks_per_rank, &scales);
}

}  // namespace asynctp::algo
