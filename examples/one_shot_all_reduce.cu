// Runs examples/one_shot_all_reduce.cuh: N ranks as threads of this process (an in-process group of
// the C API, rank r on GPU r mod the visible GPUs), each summing every rank's floats; checks every
// result against sums computed on the host and prints the time per call.
//
//   asynctp-example-all-reduce [ranks (default 2)] [floats (default 1048576)] [calls (default 100)]
//
// Where ranks share a GPU the times are not NVLink times.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "asynctp/c_api.h"
#include "one_shot_all_reduce.cuh"

namespace {

float value(int rank, int64_t i, uint32_t call) { return static_cast<float>((i * 7 + rank * 13 + call) % 101); }

// One rank: `calls` all-reduces, the first and last checked. Returns "" or what went wrong.
std::string run_rank(asynctp_group* group, int rank, int ranks, int64_t n, int calls, double* us_per_call) {
  asynctp_comm* comm = nullptr;
  if (asynctp_comm_create_in_process(group, rank, 0, nullptr, 0, &comm) != 0) return asynctp_last_error();
  asynctp_symmetric* sym = nullptr;
  asynctp_symmetric_info info{};
  if (asynctp_symmetric_create(comm, n * sizeof(float), 2 * ranks, &sym) != 0 ||
      asynctp_symmetric_get_info(sym, &info) != 0) {
    return asynctp_last_error();
  }
  cudaStream_t stream;
  float *in = nullptr, *out = nullptr;
  unsigned int* blocks_done = nullptr;
  // Stream-ordered allocations: ranks may share a GPU, and cudaMalloc or cudaFree may wait for the
  // whole GPU, a peer's wait for this rank included.
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  cudaMallocAsync(reinterpret_cast<void**>(&in), n * sizeof(float), stream);
  cudaMallocAsync(reinterpret_cast<void**>(&out), n * sizeof(float), stream);
  cudaMallocAsync(reinterpret_cast<void**>(&blocks_done), sizeof(unsigned int), stream);
  cudaMemsetAsync(blocks_done, 0, sizeof(unsigned int), stream);
  std::vector<float> host(n);
  std::string error;
  // A copy to or from pageable host memory returns only when done; while it waits behind a wait for a
  // peer, the peer's thread can wait for it in a copy of its own. So each is made once the stream is
  // idle (asynctp_comm_synchronize: bounded, with a report).
  auto check = [&](uint32_t call) {
    if (asynctp_comm_synchronize(comm, stream) != 0) return std::string(asynctp_last_error());
    cudaMemcpyAsync(host.data(), out, n * sizeof(float), cudaMemcpyDeviceToHost, stream);
    if (asynctp_comm_synchronize(comm, stream) != 0) return std::string(asynctp_last_error());
    for (int64_t i = 0; i < n; ++i) {
      float want = 0.0f;
      for (int r = 0; r < ranks; ++r) want += value(r, i, call);
      if (host[i] != want) return "call " + std::to_string(call) + ", element " + std::to_string(i) + " is wrong";
    }
    return std::string();
  };
  for (int64_t i = 0; i < n; ++i) host[i] = value(rank, i, 1);
  cudaMemcpyAsync(in, host.data(), n * sizeof(float), cudaMemcpyHostToDevice, stream);
  auto t0 = std::chrono::steady_clock::now();
  for (uint32_t call = 1; call <= static_cast<uint32_t>(calls) && error.empty(); ++call) {
    if (call == 2) {  // every later call sums the same inputs as the first: time from here
      error = check(1);
      t0 = std::chrono::steady_clock::now();
    }
    const int rc = example::one_shot_all_reduce(sym, info, in, out, n, call, blocks_done, stream);
    if (rc != 0) error = rc == -1 ? asynctp_last_error() : cudaGetErrorString(static_cast<cudaError_t>(rc));
  }
  if (error.empty() && asynctp_comm_synchronize(comm, stream) != 0) error = asynctp_last_error();
  *us_per_call = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
                 (calls > 1 ? calls - 1 : 1);
  if (error.empty() && calls > 1) error = check(1);  // the last call summed the first call's inputs
  cudaFreeAsync(in, stream);
  cudaFreeAsync(out, stream);
  cudaFreeAsync(blocks_done, stream);
  cudaStreamSynchronize(stream);
  cudaStreamDestroy(stream);
  if (asynctp_symmetric_destroy(sym) != 0 || asynctp_comm_destroy(comm) != 0) {
    if (error.empty()) error = asynctp_last_error();
  }
  return error;
}

}  // namespace

int main(int argc, char** argv) {
  // Before the first CUDA call, as for any ranks that are threads of one process (docs/design/
  // transport.md): every kernel is loaded with the context, since a kernel loaded at its first launch
  // can wait for the GPU to go idle, which it would not while another rank's kernel on it waits for
  // this one; and streams of different ranks get hardware queues of their own.
  setenv("CUDA_MODULE_LOADING", "EAGER", 0);
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
  const int ranks = argc > 1 ? std::atoi(argv[1]) : 2;
  const int64_t n = argc > 2 ? std::atoll(argv[2]) : (1 << 20);
  const int calls = argc > 3 ? std::atoi(argv[3]) : 100;
  if (ranks < 1 || n < 1 || calls < 1) {
    std::fprintf(stderr, "usage: %s [ranks >= 1] [floats >= 1] [calls >= 1]\n", argv[0]);
    return 2;
  }
  asynctp_group* group = nullptr;
  if (asynctp_in_process_group_create(ranks, nullptr, 0, &group) != 0) {
    std::fprintf(stderr, "%s\n", asynctp_last_error());
    return 1;
  }
  std::vector<std::string> errors(ranks);
  std::vector<double> us(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] { errors[r] = run_rank(group, r, ranks, n, calls, &us[r]); });
  }
  for (auto& t : threads) t.join();
  asynctp_in_process_group_destroy(group);
  int failed = 0;
  for (int r = 0; r < ranks; ++r) {
    if (!errors[r].empty()) {
      std::fprintf(stderr, "rank %d: %s\n", r, errors[r].c_str());
      failed = 1;
    }
  }
  if (failed) return 1;
  std::printf("%d ranks, %lld floats: every checked result right; %.1f us per call (rank 0, %d calls)\n", ranks,
              static_cast<long long>(n), us[0], calls);
  return 0;
}
