// asynctp-rs-lab: one partial GEMM's buffers and the calls timed on them (main.cu says what the lab
// measures and how).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "algo/fused.h"
#include "asynctp/ops.h"
#include "bench/device_buffer.h"
#include "common/check.h"
#include "common/device_fault.h"
#include "common/driver_api.h"
#include "gemm/cublaslt_gemm.h"
#include "gpu_hold.cuh"
#include "kernels/fused/fused_gemm.h"
#include "kernels/fused/staged_layout.h"
#include "kernels/fused/tail_split.h"
#include "kernels/fused/tile_trace.h"
#include "reference/reference.h"
#include "rs_lab/options.h"

namespace asynctp::rs_lab {

using bench::DeviceBuffer;
using kernels::fused::FusedGemmArgs;
using kernels::fused::RowChunks;
using kernels::fused::StagedLayout;

constexpr int kPeer = 1;  // this GPU plays rank 0; rank 1's rows are the ones it stages
// The kernel's staged counters (one per rank and chunk) and the done count after them.
// The staged counters of a two-rank team, laid out as the op's (chunk_slots.h).
constexpr kernels::fused::StagedCounters kCounters{2};
constexpr size_t kCounterBytes = kCounters.words() * sizeof(uint32_t);
// A wait in the kernel that has not ended by then will not.
constexpr uint64_t kWaitNs = 2'000'000'000ull;

inline __global__ void add_second_half(float* r, int64_t half) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < half; i += int64_t(gridDim.x) * blockDim.x) {
    r[i] += r[half + i];
  }
}

inline __global__ void empty_kernel() {}

inline CUstream cu(cudaStream_t s) { return reinterpret_cast<CUstream>(s); }
inline CUdeviceptr cu(const void* p) { return reinterpret_cast<CUdeviceptr>(p); }

// One call of a function under test: its set-up (untimed, on an idle GPU), then the call itself.
struct Call {
  std::function<void()> prepare;
  std::function<void()> run;
};

// One partial GEMM's buffers and the calls timed on them.
class Shape {
 public:
  Shape(int64_t M, int64_t N, int64_t K, int chunks, cudaStream_t main, cudaStream_t pushes)
      : M_(M), N_(N), K_(K), m_(M / 2),
        chunks_(m_, algo::resolve_fused_rs_chunks(chunks, m_)),
        main_(main), pushes_(pushes),
        a_(size_t(M) * K * 2, main), b_(size_t(K) * N * 2, main), out_(size_t(m_) * N * 2, main),
        plain_out_(size_t(M) * N * 2, main), staging_(staging_bytes(), main), inbox_(staging_bytes(), main),
        peer_inbox_(size_t(m_) * N * 2, main), counters_(kCounterBytes),
        flags_(2 * kMaxChunksPerRank * sizeof(uint32_t)), epoch_word_(sizeof(uint32_t), main),
        pushed_(kMaxChunksPerRank * sizeof(uint32_t), main), done_word_(sizeof(uint32_t)),
        done_(sizeof(kernels::fused::DoneSignal), main),
        split_(kernels::fused::tail_split_workspace_bytes(kernels::fused::sm_count()), main),
        stamps_(2 * sizeof(uint64_t), main) {
    reference::fill(a_.p, DType::kBF16, M, K, false, {1, 0, 0}, 0, 0, main_);
    reference::fill(b_.p, DType::kBF16, K, N, false, {2, 0, 0}, 0, 0, main_);
    ASYNCTP_CUDA_CHECK(cudaMemsetAsync(flags_.p, 0, 2 * kMaxChunksPerRank * sizeof(uint32_t), main_));
    ASYNCTP_CUDA_CHECK(cudaMemsetAsync(pushed_.p, 0, kMaxChunksPerRank * sizeof(uint32_t), main_));
    ASYNCTP_CUDA_CHECK(cudaMemsetAsync(done_word_.p, 0, sizeof(uint32_t), main_));
    // The reduce-scatter's done signal, which the op's kernel raises on two ranks: its one peer is
    // itself (the pushed call waits for it).
    kernels::fused::DoneSignal done;
    done.peers = 1;
    done.finished = counters_.as<uint32_t>() + kCounters.finished_warps();
    done.epoch = epoch_word_.as<uint32_t>();
    done.flag[0] = done_word_.as<uint32_t>();
    ASYNCTP_CUDA_CHECK(cudaMemcpyAsync(done_.p, &done, sizeof(done), cudaMemcpyHostToDevice, main_));
    ASYNCTP_CUDA_CHECK(cudaStreamSynchronize(main_));
    ASYNCTP_CUDA_CHECK(cudaMemsetAsync(split_.p, 0, kernels::fused::tail_split_workspace_bytes(kernels::fused::sm_count()), main_));
    ASYNCTP_CUDA_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
    ASYNCTP_CUDA_CHECK(cudaEventCreateWithFlags(&joined_, cudaEventDisableTiming));
  }
  ~Shape() {
    // The buffers are freed in main_'s order; work on pushes_ must have ended first.
    cudaStreamSynchronize(pushes_);
    cudaEventDestroy(fork_);
    cudaEventDestroy(joined_);
  }

  std::string text() const { return std::to_string(M_) + "x" + std::to_string(N_) + "x" + std::to_string(K_); }
  int chunks() const { return chunks_.used; }

  // cuBLASLt's GEMM of all M rows; with `source`, D = A @ B + C, C being the inbox read as [M, N]: what
  // an epilogue that reads a source costs cuBLAS, beside what it costs the fused kernel's own tiles.
  Call cublas(gemm::GemmRunner& runner, bool source) {
    return {[] {}, [this, &runner, source] {
              gemm::Problem p;
              p.M = M_, p.N = N_, p.K = K_;
              p.beta = source ? 1.0f : 0.0f;
              runner.run(p, a_.p, b_.p, plain_out_.p, main_, 0, source ? inbox_.p : nullptr);
            }};
  }

  // The fused kernel as a plain GEMM: all M rows, nothing staged (the bench's "fused GEMM alone").
  Call plain() {
    return {[] {}, [this] {
              FusedGemmArgs g = base();
              g.c = plain_out_.p;
              launch(g);
            }};
  }

  // The reduce-scatter's kernel, reducing in the epilogue or in fixup(), the peer's flags preset or
  // signalled, or pushed from the kernel. Its set-up is what the op's pushes leave behind (zeroed
  // counters) and a new epoch, and for preset the peer's flags already up.
  Call reduce_scatter(bool epilogue, bool signalled, bool pushed = false) {
    return {[this, signalled, pushed] {
              ++epoch_;
              ASYNCTP_CUDA_CHECK(cudaMemsetAsync(counters_.p, 0, kCounterBytes, main_));
              // The peer is done with the call before this one (other calls have run since this
              // one's last pushed call raised the flag itself).
              if (pushed) {
                ASYNCTP_CU_CHECK(detail::driver().stream_write_value32(cu(main_), cu(done_word_.p), epoch_ - 1,
                                                                       CU_STREAM_WRITE_VALUE_DEFAULT));
              }
              if (!signalled) {
                for (int j = 0; j < chunks_.used; ++j) raise_flag(main_, j);
              }
            },
            [this, epilogue, signalled, pushed] { launch_reduce_scatter(epilogue, signalled, pushed); }};
  }

  Call call(const CallKind& k, gemm::GemmRunner& runner) {
    switch (k.what) {
      case CallKind::kCublas: return cublas(runner, false);
      case CallKind::kCublasWithC: return cublas(runner, true);
      case CallKind::kPlain: return plain();
      case CallKind::kReduceScatter: break;
    }
    return reduce_scatter(k.epilogue, k.signalled, k.pushed);
  }

  // Runs `call` once, untimed.
  void once(const Call& call) {
    call.prepare();
    call.run();
  }

  // Puts the peer's chunks for `epilogue`'s layout in the inbox: what this GPU stages of rank 1's
  // rows, copied (by a kernel, on an idle GPU) where rank 1's copy of this rank's rows would land.
  void fill_inbox(bool epilogue) {
    once(reduce_scatter(epilogue, false));
    const StagedLayout layout(epilogue, N_);
    const size_t rank_bytes = layout.bytes_before(m_);
    ASYNCTP_CUDA_CHECK(cudaMemcpyAsync(inbox_.as<char>() + kPeer * rank_bytes, staging_.as<char>() + kPeer * rank_bytes,
                                       rank_bytes, cudaMemcpyDeviceToDevice, main_));
    ASYNCTP_CUDA_CHECK(cudaStreamSynchronize(main_));
  }

  // Whether the pushed call's peer inbox holds what the preset call before it staged of rank 1's rows.
  bool check_pushed() {
    const size_t bytes = size_t(m_) * N_ * 2;
    std::vector<char> pushed(bytes), staged(bytes);
    ASYNCTP_CUDA_CHECK(cudaMemcpy(pushed.data(), peer_inbox_.p, bytes, cudaMemcpyDeviceToHost));
    ASYNCTP_CUDA_CHECK(cudaMemcpy(staged.data(), staging_.as<char>() + kPeer * bytes, bytes, cudaMemcpyDeviceToHost));
    const bool same = pushed == staged;
    if (!same) std::printf("  epilogue-pushed at %s: WRONG, the peer's inbox differs from the staged tiles\n", text().c_str());
    return same;
  }

  // Checks the last reduce-scatter's output against fp32: own row r = P[r] + P[m + r].
  bool check(const char* what) {
    ASYNCTP_CUDA_CHECK(cudaStreamSynchronize(main_));
    if (reference_ == nullptr) make_reference();
    const reference::Comparison c = reference::compare(out_.p, DType::kBF16, m_, N_, reference_->as<float>(), N_, 0,
                                                       0, 1.0f, reference::tolerance(DType::kBF16, 2), main_);
    if (!c.ok()) std::printf("  %s at %s: WRONG, %lld bad elements (%s)\n", what, text().c_str(), (long long)c.bad,
                             c.where().c_str());
    return c.ok();
  }

  // Times `call` from after its set-up to its end: on an idle GPU, so that the host's time before the
  // launch counts as in the op's timed calls, or (queued) enqueued behind a kernel that holds the GPU
  // for longer than the host takes to enqueue it.
  float time(const Call& call, bool queued) {
    ASYNCTP_CUDA_CHECK(cudaStreamSynchronize(main_));
    call.prepare();
    ASYNCTP_CUDA_CHECK(cudaStreamSynchronize(main_));
    if (queued) {
      spin_for<<<1, 32, 0, main_>>>(200'000, nullptr);
      ASYNCTP_CUDA_CHECK(cudaGetLastError());
    }
    ASYNCTP_CUDA_CHECK(cudaEventRecord(start_, main_));
    call.run();
    ASYNCTP_CUDA_CHECK(cudaEventRecord(stop_, main_));
    ASYNCTP_CUDA_CHECK(cudaEventSynchronize(stop_));
    float ms = 0;
    ASYNCTP_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return ms * 1000.0f;
  }

  // Where one call's GPU time goes, µs: from the end of the kernel before it (which held the GPU while
  // the host enqueued the call) to the first CTA's start, through the tiles to the last epilogue, and
  // from there to the start of the kernel after it. Only `total` for a call that is not the fused kernel.
  struct Span {
    double before = 0, tiles = 0, after = 0, total = 0;
    bool fused = false;
  };

  // Runs `call` once between the two stamping kernels and writes its kernel's tile trace as
  // <name>_<M>x<N>x<K>_rank0.csv under --trace's folder.
  Span traced(const Call& call, const char* name) {
    tracing_ = true;
    // Once untimed first, so that no first-call set-up (cuBLASLt's plan, the kernel's parameters for a
    // traced launch, the trace buffer) is in the bracket.
    once(call);
    ASYNCTP_CUDA_CHECK(cudaStreamSynchronize(main_));
    call.prepare();
    ASYNCTP_CUDA_CHECK(cudaStreamSynchronize(main_));
    traced_.reset();
    spin_for<<<1, 32, 0, main_>>>(200'000, stamps_.as<uint64_t>());
    ASYNCTP_CUDA_CHECK(cudaGetLastError());
    call.run();
    stamp_start<<<1, 1, 0, main_>>>(stamps_.as<uint64_t>() + 1);
    ASYNCTP_CUDA_CHECK(cudaGetLastError());
    ASYNCTP_CUDA_CHECK(cudaStreamSynchronize(main_));
    tracing_ = false;
    uint64_t t[2] = {};
    ASYNCTP_CUDA_CHECK(cudaMemcpy(t, stamps_.p, sizeof(t), cudaMemcpyDeviceToHost));
    Span s;
    s.total = (t[1] - t[0]) / 1e3;
    if (traced_ != nullptr) {
      const kernels::fused::TileTraceSpan k = kernels::fused::tile_trace_span(*traced_);
      kernels::fused::write_tile_trace(name, *traced_, 0);
      s.fused = true;
      s.before = (static_cast<int64_t>(k.first_start_ns) - static_cast<int64_t>(t[0])) / 1e3;
      s.tiles = (k.last_epilogue_ns - k.first_start_ns) / 1e3;
      s.after = (static_cast<int64_t>(t[1]) - static_cast<int64_t>(k.last_epilogue_ns)) / 1e3;
    }
    return s;
  }

  void set_events(cudaEvent_t start, cudaEvent_t stop) { start_ = start, stop_ = stop; }

 private:
  void launch_reduce_scatter(bool epilogue, bool signalled, bool pushed) {
    const StagedLayout layout(epilogue, N_);
    FusedGemmArgs g = base();
    g.c = out_.p;
    kernels::fused::ReduceScatterTiles& rs = g.rs;
    rs.rank = 0;
    rs.world = 2;
    rs.rows_per_rank = static_cast<int32_t>(m_);
    rs.rows_per_chunk = static_cast<int32_t>(chunks_.rows);
    rs.tiles_n = static_cast<int32_t>(layout.tiles_n);
    rs.reduce_in_epilogue = epilogue;
    rs.staging = staging_.as<uint32_t>();
    rs.staged = counters_.as<uint32_t>();
    rs.inbox = inbox_.as<const uint32_t>();
    rs.arrived = flags_.as<const uint32_t>();
    rs.epoch = epoch_word_.as<const uint32_t>();
    rs.begin_epoch = epoch_;
    rs.epoch_out = epoch_word_.as<uint32_t>();
    rs.flag_stride = kMaxChunksPerRank;
    rs.wait = kernels::WaitContext{detail::device_fault_record(), kWaitNs, 0};
    g.done = done_.as<const kernels::fused::DoneSignal>();  // as the op's calls on two ranks
    if (pushed) {
      rs.push_inbox = peer_inbox_.as<uint32_t>();
      rs.push_count = pushed_.as<uint32_t>();  // the peer's counts are this rank's own
      rs.pushed = pushed_.as<uint32_t>();
      rs.peer_done = done_word_.as<const uint32_t>();
      launch(g);
      return;
    }
    ASYNCTP_CUDA_CHECK(cudaEventRecord(fork_, main_));
    launch(g, [&] {
      if (!signalled) return;
      // As the op's pushes, on a stream that follows the fork, not the kernel: each chunk's flag once
      // the chunk is staged (without the copy the op makes before it).
      ASYNCTP_CUDA_CHECK(cudaStreamWaitEvent(pushes_, fork_, 0));
      for (int j = 0; j < chunks_.used; ++j) {
        ASYNCTP_CU_CHECK(detail::driver().stream_wait_value32(
            cu(pushes_), cu(counters_.as<uint32_t>() + kCounters.of(kPeer, j)),
            layout.count(rs, j), CU_STREAM_WAIT_VALUE_GEQ));
        raise_flag(pushes_, j);
      }
      ASYNCTP_CUDA_CHECK(cudaEventRecord(joined_, pushes_));
      ASYNCTP_CUDA_CHECK(cudaStreamWaitEvent(main_, joined_, 0));
    });
  }

  size_t staging_bytes() const {
    return std::max(StagedLayout(true, N_).bytes_before(M_), StagedLayout(false, N_).bytes_before(M_));
  }

  FusedGemmArgs base() const {
    FusedGemmArgs g;
    g.M = M_, g.N = N_, g.K = K_;
    g.a = a_.p, g.b = b_.p;
    g.tile_n = static_cast<int>(kernels::fused::kRsTileN);
    g.split_workspace = split_.p;
    g.split_sms = kernels::fused::sm_count();
    g.split_wait = kernels::WaitContext{detail::device_fault_record(), kWaitNs, 0};
    return g;
  }

  void raise_flag(cudaStream_t s, int chunk) {
    ASYNCTP_CU_CHECK(detail::driver().stream_write_value32(
        cu(s), cu(flags_.as<uint32_t>() + kPeer * kMaxChunksPerRank + chunk), epoch_, CU_STREAM_WRITE_VALUE_DEFAULT));
  }

  // Launches the kernel, then `after` (what follows the fork recorded before it); where tracing, with
  // a trace buffer that traced() reads once the stream is done.
  void launch(FusedGemmArgs& g, const std::function<void()>& after = [] {}) {
    if (tracing_) g.trace = kernels::fused::tile_trace_buffer(g, main_);
    kernels::fused::run_fused_gemm(g, main_);
    after();
    if (g.trace != nullptr) traced_ = std::make_unique<FusedGemmArgs>(g);
  }

  void make_reference() {
    DeviceBuffer a32(size_t(M_) * K_ * 4, main_), b32(size_t(K_) * N_ * 4, main_);
    reference_ = std::make_unique<DeviceBuffer>(size_t(M_) * N_ * 4, main_);
    reference::fill_fp32(a32.as<float>(), M_, K_, {1, 0, 0}, 0, 0, main_);
    reference::fill_fp32(b32.as<float>(), K_, N_, {2, 0, 0}, 0, 0, main_);
    reference::Fp32Gemm gemm;
    gemm.run(a32.as<float>(), b32.as<float>(), reference_->as<float>(), M_, N_, K_, main_);
    add_second_half<<<1024, 256, 0, main_>>>(reference_->as<float>(), m_ * N_);
    ASYNCTP_CUDA_CHECK(cudaGetLastError());
    ASYNCTP_CUDA_CHECK(cudaStreamSynchronize(main_));
  }

  int64_t M_, N_, K_, m_;
  RowChunks chunks_;
  cudaStream_t main_, pushes_;
  DeviceBuffer a_, b_, out_, plain_out_, staging_, inbox_, peer_inbox_, counters_, flags_, epoch_word_, pushed_,
      done_word_, done_, split_, stamps_;
  std::unique_ptr<DeviceBuffer> reference_;
  uint32_t epoch_ = 0;
  cudaEvent_t fork_ = nullptr, joined_ = nullptr, start_ = nullptr, stop_ = nullptr;
  bool tracing_ = false;
  std::unique_ptr<FusedGemmArgs> traced_;  // the traced call's kernel, until traced() has written it
};

}  // namespace asynctp::rs_lab
