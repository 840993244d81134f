#include "rs_lab/options.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <optional>

#include "asynctp/error.h"
#include "asynctp/ops.h"
#include "cli/parse.h"
#include "common/check.h"
#include "kernels/fused/tile_shape.h"

namespace asynctp::rs_lab {
namespace {

const char* const kUsage =
    "usage: asynctp-rs-lab [--shapes MxNxK,...] [--iters N] [--warmup N] [--chunks N] [--queued]\n"
    "                      [--calls NAME,...] [--trace DIR]\n"
    "\n"
    "The fused reduce-scatter's partial GEMM (M rows of both ranks, K per rank) on the current GPU as\n"
    "rank 0 of two, bf16, B row-major, timed beside the same kernel as a plain GEMM and cuBLASLt\n"
    "(without and with a source C of all M rows). Both ways of reducing (epilogue, fixup), each with\n"
    "the peer's arrived flags up before the launch (preset) or raised as each chunk's staged count\n"
    "completes (signalled); nothing is copied; or the epilogue's way pushed from the kernel (pushed;\n"
    "see tools/rs_lab/main.cu). Results are checked first. Each\n"
    "call starts on an idle GPU (unless --queued); one call of each per round, rounds in shuffled\n"
    "order; medians, µs.\n"
    "  --shapes   partial GEMMs (default: the seed shapes' on two ranks and 12288x7168x2048)\n"
    "  --chunks   chunks per rank (default 0: the op's choice)\n"
    "  --calls    which of cublaslt, cublaslt-c, plain, epilogue-preset, epilogue-signalled,\n"
    "             fixup-preset, fixup-signalled, epilogue-pushed to run (default all; e.g. for ncu,\n"
    "             which cannot run a signalled call: its kernel waits for flags that a stream raises\n"
    "             beside it)\n"
    "  --queued   time each call behind a kernel that keeps the GPU busy while the host enqueues it:\n"
    "             the GPU's time alone, without the host's before the launch\n"
    "  --trace    run each call once between two kernels that stamp the GPU's timer, print where its\n"
    "             GPU time goes (before the first CTA, tiles, after the last epilogue), and write\n"
    "             the fused kernel's tile trace (ASYNCTP_TRACE_TILES) to DIR\n"
    "Exit status: 0 every result correct, 1 a wrong result, 2 bad arguments or a CUDA failure,\n"
    "77 no GPU visible.\n";

int parse_int(const std::string& flag, const std::string& text, int lo, int hi) {
  const std::optional<int64_t> v = tools::integer_in(text, lo, hi);
  ASYNCTP_CHECK(v.has_value(), flag, " expects an integer from ", lo, " to ", hi, ", got '", text, "'");
  return static_cast<int>(*v);
}

}  // namespace

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (a == "--queued") {
      o.queued = true;
      continue;
    }
    ASYNCTP_CHECK(i + 1 < argc, a, " needs a value");
    const std::string v = argv[++i];
    if (a == "--shapes") {
      o.shapes.clear();
      for (const std::string& item : tools::split(v, ',')) {
        long long m = 0, n = 0, k = 0;
        ASYNCTP_CHECK(std::sscanf(item.c_str(), "%lldx%lldx%lld", &m, &n, &k) == 3 && m > 0 && n > 0 && k > 0,
                      "--shapes: '", item, "' is not MxNxK");
        ASYNCTP_CHECK(m % (2 * kernels::fused::kClusterRows) == 0 && n % 8 == 0 && k % 8 == 0,
                      "--shapes: M must be a multiple of ", 2 * kernels::fused::kClusterRows,
                      " (two ranks of whole clusters), N and K of 8");
        o.shapes.push_back({m, n, k});
      }
    } else if (a == "--iters") {
      o.iters = parse_int(a, v, 1, 100000);
    } else if (a == "--warmup") {
      o.warmup = parse_int(a, v, 0, 100000);
    } else if (a == "--chunks") {
      o.chunks = parse_int(a, v, 0, kMaxChunksPerRank);
    } else if (a == "--trace") {
      o.trace = v;
    } else if (a == "--calls") {
      for (const std::string& name : tools::split(v, ',')) {
        ASYNCTP_CHECK(std::any_of(std::begin(kCalls), std::end(kCalls), [&](const CallKind& k) { return name == k.name; }),
                      "--calls: '", name, "' is not one of the calls --help lists");
        o.calls.push_back(name);
      }
    } else {
      detail::raise(detail::cat("unknown option ", a, "\n", kUsage));
    }
  }
  return o;
}

}  // namespace asynctp::rs_lab
