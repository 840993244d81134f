// asynctp-rs-lab: the fused reduce-scatter's kernel on one GPU, as rank 0 of two, beside the same
// kernel as a plain GEMM and cuBLASLt, so that what the kernel itself costs inside the op can be
// measured, and changed, on a machine of one GPU (docs/performance.md, "One GPU").
//
// The peer is this GPU itself, and its chunks are already in the inbox: before the timed calls, the
// staged tiles of rank 1's rows are copied into the inbox slot where rank 1's copy of this rank's rows
// would land, so that own row r ends as P[r] + P[m + r] (P the partial product, m = M / 2), which is
// checked against an fp32 GEMM. Then each call either finds the peer's arrived flags up at its
// launch (preset: no own tile waits) or has them raised, chunk by chunk, by stream memory operations
// that wait for the chunk's staged count as the op's pushes do (signalled), but copy nothing: a copy
// within one GPU runs as a kernel, which could not start beside the persistent GEMM that waits for it
// (the op's copies go to another GPU, on a copy engine). So what the lab shows is the kernel's own
// cost of staging and reducing, and of its own tiles waiting for chunks as soon as they are staged;
// not the copy engine's traffic, nor the time a chunk takes to cross NVLink.
//
// The pushed call is the epilogue's way pushed from the kernel (reduce_scatter_tiles.h, push_inbox):
// the kernel stores rank 1's rows into a buffer of their own (the peer's inbox, checked against the
// staged tiles) and counts them into the very counts its own tiles wait for, as if the peer pushed
// its chunks at the same moments; it waits for, and raises, a done flag of its own. That is the
// memory traffic of the op on two GPUs (each GPU's inbox written once, by the peer), less NVLink.
//
// Built with the tools; `asynctp-rs-lab --help` says how to run it. options.h reads the command
// line; shape.cuh holds the buffers and the calls.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "asynctp/error.h"
#include "rs_lab/options.h"
#include "rs_lab/shape.cuh"

namespace asynctp::rs_lab {
namespace {

// Exit status where no GPU is visible: what CTest's SKIP_RETURN_CODE takes (tests/CMakeLists.txt).
constexpr int kNoGpu = 77;

int run(const Options& o) {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
    std::printf("asynctp-rs-lab: no GPU visible; nothing run\n");
    return kNoGpu;
  }
  if (!o.trace.empty()) setenv("ASYNCTP_TRACE_TILES", o.trace.c_str(), 1);
  kernels::fused::load_fused_gemm_kernels();
  cudaStream_t main = nullptr, pushes = nullptr;
  int lowest = 0, highest = 0;
  ASYNCTP_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lowest, &highest));
  ASYNCTP_CUDA_CHECK(cudaStreamCreateWithFlags(&main, cudaStreamNonBlocking));
  ASYNCTP_CUDA_CHECK(cudaStreamCreateWithPriority(&pushes, cudaStreamNonBlocking, highest));  // as the op's
  cudaEvent_t start = nullptr, stop = nullptr;
  ASYNCTP_CUDA_CHECK(cudaEventCreate(&start));
  ASYNCTP_CUDA_CHECK(cudaEventCreate(&stop));
  cublasLtHandle_t handle = nullptr;
  ASYNCTP_CHECK(cublasLtCreate(&handle) == CUBLAS_STATUS_SUCCESS, "cublasLtCreate failed");
  bool all_ok = true;
  {
    gemm::GemmRunner runner;
    runner.init(handle);
    std::vector<CallKind> chosen;
    for (const CallKind& k : kCalls) {
      if (o.calls.empty() || std::find(o.calls.begin(), o.calls.end(), k.name) != o.calls.end()) chosen.push_back(k);
    }
    std::printf("partial M x N x K | chunks |");
    for (const CallKind& k : chosen) std::printf(" %s |", k.name);
    std::printf(" (µs, medians of %d%s)\n", o.iters, o.queued ? ", queued" : "");
    for (const auto& s : o.shapes) {
      Shape shape(s[0], s[1], s[2], o.chunks, main, pushes);
      shape.set_events(start, stop);
      std::vector<Call> calls;
      for (const CallKind& k : chosen) calls.push_back(shape.call(k, runner));
      // Correct first: each chosen reduce-scatter call on its own way's chunks in the inbox (timed calls
      // of the other way then read the wrong layout there: their results are not checked, and cost the
      // same).
      bool ok = true;
      for (size_t i = 0; i < chosen.size(); ++i) {
        if (chosen[i].what != CallKind::kReduceScatter) continue;
        shape.fill_inbox(chosen[i].epilogue);
        shape.once(calls[i]);
        ok = shape.check(chosen[i].name) && ok;
        if (chosen[i].pushed) ok = shape.check_pushed() && ok;
      }
      all_ok = all_ok && ok;
      if (!o.trace.empty()) {
        std::printf("  traced (µs): call | kernel before to first CTA | first CTA to last epilogue | last epilogue "
                    "to kernel after | kernel before to kernel after\n");
        const Call empty = {[] {}, [main] { empty_kernel<<<1, 32, 0, main>>>(); }};
        std::printf("  an empty kernel | - | - | - | %.1f\n", shape.traced(empty, "").total);
        for (size_t i = 0; i < calls.size(); ++i) {
          const char* name = chosen[i].name;
          const Shape::Span t = shape.traced(calls[i], name);
          if (t.fused) {
            std::printf("  %s | %.1f | %.1f | %.1f | %.1f\n", name, t.before, t.tiles, t.after, t.total);
          } else {
            std::printf("  %s | - | - | - | %.1f\n", name, t.total);
          }
        }
      }
      for (int i = 0; i < o.warmup; ++i) {
        for (const Call& c : calls) shape.time(c, o.queued);
      }
      std::vector<std::vector<float>> us(calls.size());
      std::vector<size_t> order(calls.size());
      std::iota(order.begin(), order.end(), size_t{0});
      std::mt19937 rng(20261123);
      for (int i = 0; i < o.iters; ++i) {
        std::shuffle(order.begin(), order.end(), rng);
        for (const size_t c : order) us[c].push_back(shape.time(calls[c], o.queued));
      }
      std::printf("%s | %d |", shape.text().c_str(), shape.chunks());
      for (auto& u : us) {
        std::sort(u.begin(), u.end());
        std::printf(" %.1f |", u[u.size() / 2]);
      }
      std::printf("%s\n", ok ? "" : " (WRONG results above)");
      std::fflush(stdout);
    }
  }
  cublasLtDestroy(handle);
  return all_ok ? 0 : 1;
}

}  // namespace
}  // namespace asynctp::rs_lab

int main(int argc, char** argv) {
  try {
    return asynctp::rs_lab::run(asynctp::rs_lab::parse(argc, argv));
  } catch (const asynctp::Error& e) {
    std::fprintf(stderr, "asynctp-rs-lab: %s\n", e.what());
    return 2;
  }
}
