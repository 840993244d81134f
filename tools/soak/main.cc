// asynctp-soak: many calls of each op and algorithm with random legal arguments, every few checked
// against a reference, and the GPU and host memory recorded along the way (docs/design/reliability.md).
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <limits>
#include <fstream>
#include <optional>
#include <sstream>

#include "asynctp/asynctp.h"
#include "asynctp/launcher.h"
#include "bench/case.h"
#include "bench/cli.h"
#include "bench/device_buffer.h"
#include "bench/json.h"
#include "cli/parse.h"
#include "common/check.h"
#include "reference/reference.h"
#include "soak/calls.h"

namespace asynctp::soak {
namespace {

const char* const kUsage =
    "usage: asynctp-soak [options]\n"
    "\n"
    "Launches one rank per GPU and, for each op and algorithm, makes --calls calls with random legal\n"
    "arguments (dtype, B layout, gather/scatter dim, M, N, K, one or two B, return_a, sum or avg)\n"
    "drawn from --seed, the same on every rank. Every --check-every-th call (and the last) gets fresh\n"
    "inputs and is checked against an fp32 reference on every rank; the others run back to back on\n"
    "whatever the buffers hold. GPU memory in use and the process's resident memory are read after\n"
    "every tenth of the calls (on stderr); growing by more than --max-growth-mib over the second half\n"
    "of the calls fails the run (a leak grows with the calls; caches that fill as new shapes come\n"
    "level off), as does any error or wrong result (named with the call's index and arguments).\n"
    "\n"
    "  --calls N            calls per op and algorithm (default 100000)\n"
    "  --check-every N      check one call in N (default 100)\n"
    "  --seed N             the arguments' generator seed (default 1)\n"
    "  --max-dim N          largest M, N and K (default 1024; a multiple of 8 x world size)\n"
    "  --max-growth-mib N   allowed growth of GPU and of host memory over the second half (default 16)\n"
    "  --gpus, --ranks-per-gpu, --op, --algorithms, --json   as for asynctp-bench (default algorithms: sequential,\n"
    "                       pipelined, fused, auto)\n"
    "  -h, --help           this text\n";

struct SoakArgs {
  bench::Args bench;
  int64_t calls = 100000, check_every = 100, max_dim = 1024, max_growth_mib = 16;
  uint64_t seed = 1;
};

int64_t parse_count(const std::string& flag, const std::string& v, int64_t min) {
  const std::optional<int64_t> n = tools::integer_in(v, min, std::numeric_limits<int64_t>::max());
  ASYNCTP_CHECK(n.has_value(), "asynctp-soak: ", flag, " '", v, "' is not valid; expected an integer from ", min,
                " to ", std::numeric_limits<int64_t>::max());
  return *n;
}

SoakArgs parse(const std::vector<std::string>& argv) {
  SoakArgs s;
  std::vector<std::string> rest = {"--algorithms", "sequential,pipelined,fused,auto"};
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& f = argv[i];
    if (f == "--calls" || f == "--check-every" || f == "--seed" || f == "--max-dim" || f == "--max-growth-mib") {
      ASYNCTP_CHECK(i + 1 < argv.size(), "asynctp-soak: ", f, " needs a value (see --help)");
      const std::string& v = argv[++i];
      if (f == "--calls") s.calls = parse_count(f, v, 1);
      if (f == "--check-every") s.check_every = parse_count(f, v, 1);
      if (f == "--seed") s.seed = static_cast<uint64_t>(parse_count(f, v, 0));
      if (f == "--max-dim") s.max_dim = parse_count(f, v, 256);
      if (f == "--max-growth-mib") s.max_growth_mib = parse_count(f, v, 0);
    } else if (f == "--shapes" || f == "--dtype" || f == "--gather-dim" || f == "--scatter-dim" || f == "--b-layout" ||
               f == "--chunks" || f == "--iters" || f == "--warmup" || f == "--flush-l2") {
      detail::raise(detail::cat("asynctp-soak: ", f, " is asynctp-bench's; the soak draws its own arguments"));
    } else {
      rest.push_back(f);
    }
  }
  try {
    s.bench = bench::parse_args(rest);
  } catch (const Error& e) {  // the shared parser speaks as asynctp-bench
    std::string m = e.what();
    if (m.rfind("asynctp-bench", 0) == 0) m.replace(0, 13, "asynctp-soak");
    throw Error(m);
  }
  return s;
}

using bench::DeviceBuffer;

double gpu_used_mib() {
  size_t free_b = 0, total_b = 0;
  ASYNCTP_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return static_cast<double>(total_b - free_b) / (1 << 20);
}

double rss_mib() {
  std::ifstream statm("/proc/self/statm");
  long pages = 0, resident = 0;
  statm >> pages >> resident;
  return static_cast<double>(resident) * static_cast<double>(::sysconf(_SC_PAGESIZE)) / (1 << 20);
}

// The fp32 inputs and references of a checked call, sized for the largest call and made once: memory
// taken and given back around each check would blur the memory curve the soak watches.
struct CheckBuffers {
  DeviceBuffer a_full, b_full, ref0, ref1;
  CheckBuffers(int64_t elems, cudaStream_t s)
      : a_full(elems * 4, s), b_full(elems * 4, s), ref0(elems * 4, s), ref1(elems * 4, s) {}
};

// Fresh inputs for `c` from `seed`, the reference, and the comparison of this rank's outputs; returns
// the largest error, or throws naming what was wrong.
double check_call(Communicator& comm, const Call& c, const Tensors& t, uint64_t seed, reference::Fp32Gemm& fp32,
                  const CheckBuffers& buf, cudaStream_t s, const std::function<void()>& run) {
  const int ws = comm.world_size(), r = comm.rank();
  const int64_t M = c.M, K = c.K, kl = K / ws;
  const bool col = c.b_layout == BLayout::kColMajor;
  reference::GenMatrix gen_a{seed, 0, 0};
  int64_t a_row0 = 0, a_col0 = 0;
  if (c.ag && !c.last_dim) gen_a.row_block = M / ws, a_row0 = r * (M / ws);
  if (!c.ag || c.last_dim) gen_a.col_block = kl, a_col0 = r * kl;
  reference::fill(t.a.data, c.dtype, t.a.shape[0], t.a.shape[1], false, gen_a, a_row0, a_col0, s);
  const DeviceBuffer& a_full = buf.a_full;
  reference::fill_fp32(a_full.f(), M, K, gen_a, 0, 0, s);
  const DeviceBuffer* refs[2] = {&buf.ref0, &buf.ref1};
  for (size_t i = 0; i < t.bs.size(); ++i) {
    const int64_t n = c.N + 8 * static_cast<int64_t>(i);
    const reference::GenMatrix gen_b{seed + 1 + i, c.ag ? 0 : kl, 0};
    const int64_t b_rows = c.ag ? K : kl;
    reference::fill(t.bs[i].data, c.dtype, b_rows, n, col, gen_b, c.ag ? 0 : r * kl, 0, s);
    reference::fill_fp32(buf.b_full.f(), K, n, gen_b, 0, 0, s);  // (the GEMM below runs before the next fill)
    fp32.run(a_full.f(), buf.b_full.f(), refs[i]->f(), M, n, K, s);
    reference::poison(t.outs[i].data, t.outs[i].bytes(), s);
  }
  if (t.gathered.defined()) reference::poison(t.gathered.data, t.gathered.bytes(), s);
  run();
  double max_err = 0;
  const float scale = !c.ag && c.reduce == ReduceOp::kAvg ? 1.0f / ws : 1.0f;
  for (size_t i = 0; i < t.outs.size(); ++i) {
    const int64_t n = c.N + 8 * static_cast<int64_t>(i);
    const int64_t cols = c.ag ? n : t.out_cols;
    const auto cmp = reference::compare(t.outs[i].data, c.dtype, t.out_rows, cols, refs[i]->f(), n, t.out_row0,
                                        t.out_col0, scale, reference::tolerance(c.dtype, c.ag ? 1 : ws), s);
    ASYNCTP_CHECK(cmp.ok(), "output ", i, ": ", cmp.bad, " bad elements, max err ", cmp.max_abs_err, cmp.where());
    max_err = std::max(max_err, cmp.max_abs_err);
  }
  if (t.gathered.defined()) {
    const auto cmp = reference::compare(t.gathered.data, c.dtype, M, K, a_full.f(), K, 0, 0, 1.0f, 0.0, s);
    ASYNCTP_CHECK(cmp.ok(), "gathered A: ", cmp.bad, " elements differ");
  }
  return max_err;
}

struct Outcome {
  int64_t calls = 0, checks = 0;
  double max_err = 0, seconds = 0;
  double gpu_mib[2] = {0, 0}, rss_mib[2] = {0, 0};  // after half of the calls, at the end
  std::string error;
};

Outcome soak_one(Communicator& comm, const SoakArgs& args, bool ag, Algorithm algorithm, cudaStream_t s) {
  const int ws = comm.world_size(), r = comm.rank();
  const int64_t elems = max_elements(args.max_dim);
  DeviceBuffer a(elems * 2, s), b0(elems * 2, s), b1(elems * 2, s), o0(elems * 2, s), o1(elems * 2, s), g(elems * 2, s);
  void* const bs[2] = {b0.p, b1.p};
  void* const outs[2] = {o0.p, o1.p};
  ASYNCTP_CUDA_CHECK(cudaMemsetAsync(a.p, 0, elems * 2, s));  // zeros: finite inputs for unchecked calls
  ASYNCTP_CUDA_CHECK(cudaMemsetAsync(b0.p, 0, elems * 2, s));
  ASYNCTP_CUDA_CHECK(cudaMemsetAsync(b1.p, 0, elems * 2, s));
  reference::Fp32Gemm fp32;
  const CheckBuffers check_buffers(elems, s);
  std::mt19937_64 rng(args.seed * 2 + (ag ? 0 : 1));
  Outcome out;
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t tenth = std::max<int64_t>(1, args.calls / 10);  // memory is read every tenth of the calls
  for (int64_t i = 0; i < args.calls; ++i) {
    const Call c = draw_call(rng, ag, ws, args.max_dim);
    const Tensors t = tensors_of(c, r, ws, a.p, bs, outs, g.p);
    OpOptions o;
    o.algorithm = algorithm;
    o.b_layout = c.b_layout;
    auto run = [&] {
      if (ag) {
        all_gather_matmul(comm, t.a, t.bs, t.dim, t.outs, t.gathered, s, o);
      } else {
        matmul_reduce_scatter(comm, t.a, t.bs[0], t.dim, c.reduce, t.outs[0], s, o);
      }
    };
    try {
      if ((i + 1) % args.check_every == 0 || i + 1 == args.calls) {
        out.max_err = std::max(out.max_err, check_call(comm, c, t, args.seed * 1000003 + i, fp32, check_buffers, s, run));
        ++out.checks;
      } else {
        run();
      }
      if (i % 32 == 31) comm.synchronize(s);  // bounds the queue, and a failure is seen near its call
    } catch (const Error& e) {
      out.error = detail::cat("call ", i, " (", describe(c), "): ", e.what());
      return out;
    }
    ++out.calls;
    if ((i + 1) % tenth == 0 || i + 1 == args.calls) {
      comm.synchronize(s);
      const double gpu = gpu_used_mib(), host = rss_mib();
      // The whole curve, on stderr: where a growth levels off.
      if (r == 0) std::fprintf(stderr, "soak: %s %s call %lld: GPU %.1f MiB, host %.1f MiB\n", ag ? "ag" : "rs",
                               algorithm_name(algorithm), static_cast<long long>(i + 1), gpu, host);
      if (i + 1 == 5 * tenth || i + 1 == args.calls) {
        const int at = i + 1 == args.calls ? 1 : 0;
        out.gpu_mib[at] = gpu;
        out.rss_mib[at] = host;
      }
    }
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

int run_rank(RankContext& ctx, const SoakArgs& args) {
  auto comm = Communicator::create(ctx, [&] {
    CommunicatorOptions o;
    o.device = ctx.device;
    return o;
  }());
  cudaStream_t s;
  ASYNCTP_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::ofstream json;
  if (ctx.rank == 0 && !args.bench.json.empty()) json.open(args.bench.json, std::ios::app);
  if (ctx.rank == 0) {
    std::printf("%d ranks, %lld calls per op and algorithm, one in %lld checked, seed %llu, dims <= %lld\n",
                ctx.world_size, static_cast<long long>(args.calls), static_cast<long long>(args.check_every),
                static_cast<unsigned long long>(args.seed), static_cast<long long>(args.max_dim));
    std::printf("%-22s %-10s %8s %7s %9s %8s %17s %17s  %s\n", "op", "algorithm", "calls", "checks", "max err",
                "seconds", "GPU MiB (50%->end)", "host MiB (50%->end)", "verdict");
    std::fflush(stdout);
  }
  int failures = 0;
  for (const bool ag : {true, false}) {
    if ((ag && !args.bench.run_ag) || (!ag && !args.bench.run_rs)) continue;
    for (const Algorithm algorithm : args.bench.algorithms) {
      const Outcome o = soak_one(*comm, args, ag, algorithm, s);
      if (!o.error.empty()) {
        std::fprintf(stderr, "rank %d: %s\n", ctx.rank, o.error.c_str());
        return 1;  // the communicator may be broken: the launcher stops the others
      }
      // The row shows the worst over the ranks: the largest error, the longest time, and the readings
      // of the rank whose memory grew most (growth anywhere fails the row).
      std::ostringstream mine;
      mine << o.max_err << ' ' << o.seconds << ' ' << o.gpu_mib[0] << ' ' << o.gpu_mib[1] << ' ' << o.rss_mib[0]
           << ' ' << o.rss_mib[1];
      double worst_growth_gpu = 0, worst_growth_rss = 0;
      Outcome shown = o;
      auto take_if_grew_more = [](double (&shown_mib)[2], const double (&x_mib)[2], double& worst) {
        if (x_mib[1] - x_mib[0] <= worst) return;
        worst = x_mib[1] - x_mib[0];
        shown_mib[0] = x_mib[0], shown_mib[1] = x_mib[1];
      };
      for (const std::string& theirs : ctx.allgather(mine.str())) {
        std::istringstream in(theirs);
        Outcome x;
        in >> x.max_err >> x.seconds >> x.gpu_mib[0] >> x.gpu_mib[1] >> x.rss_mib[0] >> x.rss_mib[1];
        shown.max_err = std::max(shown.max_err, x.max_err);
        shown.seconds = std::max(shown.seconds, x.seconds);
        take_if_grew_more(shown.gpu_mib, x.gpu_mib, worst_growth_gpu);
        take_if_grew_more(shown.rss_mib, x.rss_mib, worst_growth_rss);
      }
      const bool flat = worst_growth_gpu <= args.max_growth_mib && worst_growth_rss <= args.max_growth_mib;
      if (!flat) ++failures;
      if (ctx.rank == 0) {
        const char* op = ag ? "all_gather_matmul" : "matmul_reduce_scatter";
        const std::string gpu = detail::cat(static_cast<int64_t>(shown.gpu_mib[0]), " -> ", static_cast<int64_t>(shown.gpu_mib[1]));
        const std::string host = detail::cat(static_cast<int64_t>(shown.rss_mib[0]), " -> ", static_cast<int64_t>(shown.rss_mib[1]));
        std::printf("%-22s %-10s %8lld %7lld %9.3g %8.1f %17s %17s  %s\n", op, algorithm_name(algorithm),
                    static_cast<long long>(o.calls), static_cast<long long>(o.checks), shown.max_err, shown.seconds,
                    gpu.c_str(), host.c_str(), flat ? "ok" : "MEMORY GREW");
        std::fflush(stdout);
        if (json.is_open()) {
          json << bench::JsonLine()
                      .add("tool", "asynctp-soak")
                      .add("op", op)
                      .add("algorithm", algorithm_name(algorithm))
                      .add("world_size", ctx.world_size)
                      .add("calls", o.calls)
                      .add("checks", o.checks)
                      .add("seed", static_cast<int64_t>(args.seed))
                      .add("max_dim", args.max_dim)
                      .add("max_err", shown.max_err)
                      .add("seconds", shown.seconds)
                      .add("gpu_mib_at_half", shown.gpu_mib[0])
                      .add("gpu_mib_at_end", shown.gpu_mib[1])
                      .add("rss_mib_at_half", shown.rss_mib[0])
                      .add("rss_mib_at_end", shown.rss_mib[1])
                      .add("flat", flat)
                      .str()
               << "\n";
        }
      }
    }
  }
  ASYNCTP_CUDA_CHECK(cudaStreamDestroy(s));
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace asynctp::soak

int main(int argc, char** argv) {
  using namespace asynctp;
  soak::SoakArgs args;
  try {
    args = soak::parse(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  if (args.bench.help) {
    std::fputs(soak::kUsage, stdout);
    return 0;
  }
  return bench::launch_tool("asynctp-soak", args.bench.gpus, args.bench.ranks_per_gpu,
                            [&](RankContext& ctx) { return soak::run_rank(ctx, args); });
}
