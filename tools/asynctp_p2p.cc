// asynctp-p2p: checks the symmetric memory of a node and measures copy-engine pulls through host-side
// peer pointers. Until asynctp-bench exists it is also the smoke run of the set-up.
//
// Each rank (one process per GPU, forked by the launcher) makes a Communicator and a SymmetricBuffer,
// fills its part with a byte pattern of its own, and pulls the part of rank (r+1) mod N with
// cudaMemcpyAsync through SymmetricBuffer::peer(): first once to check every byte, then timed, all
// ranks at once (so with 2 ranks both NVLink directions carry a pull at the same time).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "asynctp/asynctp.h"
#include "asynctp/launcher.h"
#include "cli/parse.h"

namespace {

struct Args {
  int gpus = 0;  // 0: all visible
  size_t mib = 64;
  int iters = 20;
  std::string json;
};

const char* kUsage =
    "usage: asynctp-p2p [--gpus N] [--mib M] [--iters K] [--json FILE]\n"
    "\n"
    "Launches one rank per GPU, checks that every rank reads its peer's symmetric memory correctly, and\n"
    "times copy-engine pulls of M MiB from peer (rank+1) mod N through host-side peer pointers, all ranks\n"
    "pulling at once. Prints GB/s per rank (one direction each); exits non-zero on a wrong byte, a\n"
    "failed rank, or a machine without a GPU.\n"
    "\n"
    "  --gpus N     ranks (and GPUs) to use; default: every visible GPU\n"
    "  --mib M      bytes pulled per copy, in MiB; default 64\n"
    "  --iters K    timed copies per rank; default 20 (the median is reported)\n"
    "  --json FILE  also write one JSON object per rank to FILE\n";

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr, "asynctp-p2p: %s\n\n%s", msg.c_str(), kUsage);
  std::exit(2);
}

long parse_positive(const char* flag, const char* text) {
  const std::optional<int64_t> v = asynctp::tools::integer_in(text, 1, std::numeric_limits<int>::max());
  if (!v) {
    usage_error(std::string(flag) + " expects a positive integer (at most " +
                std::to_string(std::numeric_limits<int>::max()) + "), got '" + text + "'");
  }
  return static_cast<long>(*v);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    if (f == "-h" || f == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (i + 1 >= argc) usage_error("missing value for " + f);
    const char* v = argv[++i];
    if (f == "--gpus") a.gpus = static_cast<int>(parse_positive("--gpus", v));
    else if (f == "--mib") a.mib = static_cast<size_t>(parse_positive("--mib", v));
    else if (f == "--iters") a.iters = static_cast<int>(parse_positive("--iters", v));
    else if (f == "--json") a.json = v;
    else usage_error("unknown option " + f);
  }
  return a;
}

#define CUDA_OK(expr)                                                                        \
  do {                                                                                       \
    const cudaError_t e_ = (expr);                                                           \
    if (e_ != cudaSuccess) throw asynctp::Error(std::string(#expr) + ": " + cudaGetErrorString(e_)); \
  } while (0)

unsigned char pattern_of(int rank) { return static_cast<unsigned char>(0x5A ^ (rank * 37 + 11)); }

int run_rank(asynctp::RankContext& ctx, const Args& args) {
  asynctp::CommunicatorOptions options;
  options.device = ctx.device;
  auto comm = asynctp::Communicator::create(ctx, options);
  const size_t bytes = args.mib << 20;
  auto buf = asynctp::SymmetricBuffer::create(*comm, bytes);
  void* dst = nullptr;
  CUDA_OK(cudaMalloc(&dst, bytes));
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CUDA_OK(cudaMemsetAsync(buf->local(), pattern_of(ctx.rank), bytes, stream));
  comm->barrier(stream);  // every rank's pattern is in place before anyone pulls

  const int lsa_peer = (comm->lsa().rank + 1) % comm->lsa().size;
  const int peer = comm->lsa_to_world(lsa_peer);
  const void* src = buf->peer(lsa_peer);
  CUDA_OK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
  std::vector<unsigned char> host(bytes);
  CUDA_OK(cudaMemcpyAsync(host.data(), dst, bytes, cudaMemcpyDeviceToHost, stream));
  comm->synchronize(stream);
  const size_t wrong = static_cast<size_t>(
      std::count_if(host.begin(), host.end(), [&](unsigned char b) { return b != pattern_of(peer); }));

  // Timed: a barrier before each copy lines the ranks up so their pulls overlap.
  cudaEvent_t start, stop;
  CUDA_OK(cudaEventCreate(&start));
  CUDA_OK(cudaEventCreate(&stop));
  std::vector<float> us;
  for (int i = -3; i < args.iters; ++i) {
    comm->barrier(stream);
    CUDA_OK(cudaEventRecord(start, stream));
    CUDA_OK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
    CUDA_OK(cudaEventRecord(stop, stream));
    comm->synchronize(stream);
    float ms = 0;
    CUDA_OK(cudaEventElapsedTime(&ms, start, stop));
    if (i >= 0) us.push_back(ms * 1000.0f);
  }
  std::sort(us.begin(), us.end());
  const double median_us = us[us.size() / 2];
  const double gbps = static_cast<double>(bytes) / (median_us * 1e3);

  std::ostringstream line;
  line << ctx.rank << ' ' << peer << ' ' << median_us << ' ' << gbps << ' ' << wrong;
  const auto all = ctx.allgather(line.str());
  if (ctx.rank == 0) {
    cudaDeviceProp prop{};
    CUDA_OK(cudaGetDeviceProperties(&prop, ctx.device));
    std::printf("asynctp-p2p: %d rank(s) on %s, copy-engine pull of %zu MiB through host peer pointers, all ranks "
                "at once, median of %d\n",
                ctx.world_size, prop.name, args.mib, args.iters);
    std::printf("%6s %6s %12s %10s %8s\n", "rank", "from", "median_us", "GB/s", "check");
    std::ofstream json;
    if (!args.json.empty()) json.open(args.json);
    for (const auto& l : all) {
      std::istringstream in(l);
      int r, p;
      double t, g;
      size_t w;
      in >> r >> p >> t >> g >> w;
      std::printf("%6d %6d %12.1f %10.1f %8s\n", r, p, t, g, w == 0 ? "ok" : "WRONG");
      if (json) {
        json << "{\"tool\":\"asynctp-p2p\",\"rank\":" << r << ",\"peer\":" << p << ",\"bytes\":" << bytes
             << ",\"median_us\":" << t << ",\"gbps\":" << g << ",\"wrong_bytes\":" << w << ",\"world_size\":"
             << ctx.world_size << ",\"gpu\":\"" << prop.name << "\"}\n";
      }
    }
    std::fflush(stdout);
  }
  CUDA_OK(cudaEventDestroy(start));
  CUDA_OK(cudaEventDestroy(stop));
  CUDA_OK(cudaStreamDestroy(stream));
  CUDA_OK(cudaFree(dst));
  if (wrong != 0) {
    std::fprintf(stderr, "rank %d: %zu of %zu bytes pulled from rank %d are wrong\n", ctx.rank, wrong, bytes, peer);
    return 3;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  std::string reason;
  const int visible = asynctp::probe_cuda_device_count(&reason);
  if (visible == 0) {
    std::fprintf(stderr, "asynctp-p2p: no GPU on this machine (%s); it needs at least one CUDA GPU, two or more "
                 "for a peer-to-peer pull.\n", reason.c_str());
    return 2;
  }
  const int n = args.gpus > 0 ? args.gpus : visible;
  if (n > visible) {
    std::fprintf(stderr, "asynctp-p2p: --gpus %d but only %d GPU(s) are visible\n", n, visible);
    return 2;
  }
  try {
    const asynctp::LaunchResult result =
        asynctp::launch(n, [&](asynctp::RankContext& ctx) { return run_rank(ctx, args); });
    if (!result.ok) {
      std::fprintf(stderr, "asynctp-p2p: %s\n", result.message.c_str());
      return 1;
    }
  } catch (const asynctp::Error& e) {
    std::fprintf(stderr, "asynctp-p2p: %s\n", e.what());
    return 1;
  }
  return 0;
}
