#include "bench/cli.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>

#include "asynctp/error.h"
#include "cli/parse.h"

namespace asynctp::bench {

const char* const kUsage =
    "usage: asynctp-bench [options]\n"
    "\n"
    "Launches one rank per GPU, runs each algorithm on each shape, checks every result against a\n"
    "reference computed another way (inputs regenerated on every rank, fp32 cuBLASLt GEMM), and times\n"
    "the correct ones beside the GEMM alone and the communication alone. A wrong result is reported as\n"
    "wrong and not timed.\n"
    "\n"
    "  --gpus N             GPUs to run on, one rank each (default: every visible GPU)\n"
    "  --ranks-per-gpu R    R ranks on each GPU, as threads of one process (the in-process transport,\n"
    "                       for multi-rank runs on fewer GPUs: results checked as ever, but the timings\n"
    "                       are not NVLink timings) (default 1)\n"
    "  --shapes LIST        comma-separated MxNxK (the global problem) and sets: 'seeds' (the\n"
    "                       default: 4096x3584x8192, 2048x3584x8192, 4096x6656x16384,\n"
    "                       16384x8192x8192), 'sweep' (8 shapes, M from 256 to 32768)\n"
    "  --op ag|rs|both      all_gather_matmul, matmul_reduce_scatter or both (default both)\n"
    "  --dtype bf16|fp16|e4m3\n"
    "                       input type (default bf16); the output is of the same type, but for e4m3:\n"
    "                       fp8 A and B, B column-major, the scaled ops, the GEMM alone cuBLASLt's\n"
    "                       fp8 GEMM\n"
    "  --out-dtype bf16|fp16\n"
    "                       e4m3: the output's type, and the bias's (default bf16)\n"
    "  --scales tensor|row  e4m3's scales: one per tensor, or one per row of A and one per column of\n"
    "                       B (default tensor)\n"
    "  --fast-accum         e4m3: use_fast_accum, in the ops and in cuBLASLt's GEMM alone. Fused runs\n"
    "                       the fused kernel's fp8 form only with this (else pipelined); the kernel\n"
    "                       is then also timed as a GEMM alone (rs with row-wise scales: as a\n"
    "                       one-rank reduce-scatter's kernel, which scales its tiles as each rank's\n"
    "                       does before the sum)\n"
    "  --bias               e4m3: a bias over N, in the ops (the reduce-scatter's added to every\n"
    "                       rank's partial product, as torch._scaled_mm's would be), in cuBLASLt's\n"
    "                       GEMM alone and in the fused kernel alone\n"
    "  --gather-dim 0|last  how A is sharded for ag (default 0: along M)\n"
    "  --scatter-dim 0|last how the output is scattered for rs (default 0: along M)\n"
    "  --b-layout row|col   B as [K, N] row-major or [N, K] (nn.Linear's weight) (default row)\n"
    "  --algorithms LIST    comma-separated: sequential, pipelined, fused, auto (default sequential);\n"
    "                       auto's row is labelled with its choice (auto:fused/2; * where the model\n"
    "                       chose, the tuning cache having no entry for the shape)\n"
    "  --chunks N           chunks per rank for pipelined and fused, 0 to 16 (default 0: the library\n"
    "                       chooses)\n"
    "  --iters N            timed rounds (default 30); the median is reported, the max over ranks\n"
    "  --warmup N           untimed rounds first (default 8)\n"
    "  --flush-l2           overwrite a buffer larger than L2 before each timed iteration\n"
    "  --json FILE          also write one JSON object per line per (shape, op, algorithm)\n"
    "  -h, --help           this text\n"
    "\n"
    "TFLOP/s counts the FLOPs each GPU performs: 2*M*N*K for ag, 2*M*N*K/world for rs.\n"
    "Each shape's algorithms are checked first; then the correct ones and the baselines (GEMM alone,\n"
    "communication alone) are timed in rounds, one call of each per round in an order shuffled anew\n"
    "each round, so that drift of clocks or temperature and what each call leaves behind fall on all\n"
    "alike. Each timed call starts on an idle GPU, the ranks let go together\n"
    "by a spin barrier on shared host memory.\n"
    "Overlap efficiency = max(GEMM alone, communication alone) / time. With fused in --algorithms, the\n"
    "fused kernel is also timed as a plain GEMM beside cuBLAS (ag: every chunk in place; rs: the\n"
    "partial GEMM in the reduce-scatter's tiles at this world size, 192, 256 or 320 wide, or 128 in\n"
    "one-CTA clusters at an odd number of 128-row tiles a rank, which only a problem of one tile\n"
    "row times; as at three ranks where there is one; nothing staged or reduced). fused runs\n"
    "gather-dim last, scatter-dim last, and rs with rows per rank not a multiple of 128 (or an odd\n"
    "number of 128-row tiles in more than two rounds of 128 x 128 tiles) through pipelined.\n";

std::vector<Shape> seed_shapes() {
  return {{4096, 3584, 8192}, {2048, 3584, 8192}, {4096, 6656, 16384}, {16384, 8192, 8192}};
}

std::vector<Shape> sweep_shapes() {
  return {{256, 8192, 8192},   {512, 4096, 4096},   {1024, 8192, 8192},   {2048, 14336, 4096},
          {8192, 4096, 4096},  {8192, 8192, 8192},  {16384, 4096, 14336}, {32768, 4096, 4096}};
}

namespace {

[[noreturn]] void bad(const std::string& option, const std::string& value, const std::string& expected) {
  throw Error("asynctp-bench: " + option + " '" + value + "' is not valid; expected " + expected);
}

// A decimal integer in [min, max] (by default what an int holds, so that no caller's cast cuts it).
int64_t parse_int(const std::string& option, const std::string& text, int64_t min,
                  int64_t max = std::numeric_limits<int>::max()) {
  const std::optional<int64_t> v = tools::integer_in(text, min, max);
  if (!v) bad(option, text, "an integer from " + std::to_string(min) + " to " + std::to_string(max));
  return *v;
}

// Whether `path` can be written (appended to) without creating it: the run would otherwise find out
// only at its end.
bool writable(const std::string& path) {
  if (::access(path.c_str(), F_OK) == 0) return ::access(path.c_str(), W_OK) == 0;
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  return ::access(dir.c_str(), W_OK | X_OK) == 0;
}

Shape parse_shape(const std::string& text) {
  const auto parts = tools::split(text, 'x');
  if (parts.size() != 3) bad("--shapes", text, "MxNxK, e.g. 4096x3584x8192, 'seeds' or 'sweep'");
  return {parse_int("--shapes", parts[0], 1), parse_int("--shapes", parts[1], 1), parse_int("--shapes", parts[2], 1)};
}

Algorithm parse_algorithm(const std::string& text) {
  for (Algorithm a : {Algorithm::kSequential, Algorithm::kPipelined, Algorithm::kFused, Algorithm::kAuto}) {
    if (text == algorithm_name(a)) return a;
  }
  bad("--algorithms", text, "sequential, pipelined, fused or auto");
}

bool parse_dim(const std::string& option, const std::string& text) {
  if (text == "0") return false;
  if (text == "last" || text == "-1") return true;
  bad(option, text, "0 or last");
}

}  // namespace

Args parse_args(const std::vector<std::string>& argv) {
  Args a;
  a.shapes = seed_shapes();
  bool scales_given = false, b_layout_given = false, out_given = false;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& f = argv[i];
    if (f == "-h" || f == "--help") {
      a.help = true;
      continue;
    }
    if (f == "--flush-l2") {
      a.flush_l2 = true;
      continue;
    }
    if (f == "--fast-accum") {
      a.fast_accum = true;
      continue;
    }
    if (f == "--bias") {
      a.bias = true;
      continue;
    }
    if (f.rfind("--", 0) != 0) throw Error("asynctp-bench: unexpected argument '" + f + "' (see --help)");
    if (i + 1 >= argv.size()) throw Error("asynctp-bench: " + f + " needs a value (see --help)");
    const std::string& v = argv[++i];
    if (f == "--gpus") {
      a.gpus = static_cast<int>(parse_int(f, v, 1));
    } else if (f == "--ranks-per-gpu") {
      a.ranks_per_gpu = static_cast<int>(parse_int(f, v, 1));
    } else if (f == "--shapes") {
      a.shapes.clear();
      if (v.empty()) bad(f, v, "MxNxK, 'seeds' or 'sweep', or a comma-separated list of them");
      for (const auto& s : tools::split(v, ',')) {
        if (s.empty()) bad(f, s, "MxNxK, 'seeds' or 'sweep'");
        if (s == "seeds" || s == "sweep") {
          const auto set = s == "seeds" ? seed_shapes() : sweep_shapes();
          a.shapes.insert(a.shapes.end(), set.begin(), set.end());
        } else {
          a.shapes.push_back(parse_shape(s));
        }
      }
    } else if (f == "--op") {
      if (v != "ag" && v != "rs" && v != "both") bad(f, v, "ag, rs or both");
      a.run_ag = v != "rs";
      a.run_rs = v != "ag";
    } else if (f == "--dtype") {
      if (v != "bf16" && v != "fp16" && v != "e4m3") bad(f, v, "bf16, fp16 or e4m3");
      a.dtype = v == "bf16" ? DType::kBF16 : v == "fp16" ? DType::kFP16 : DType::kFP8E4M3;
    } else if (f == "--out-dtype") {
      if (v != "bf16" && v != "fp16") bad(f, v, "bf16 or fp16");
      a.out_dtype = v == "bf16" ? DType::kBF16 : DType::kFP16;
      out_given = true;
    } else if (f == "--scales") {
      if (v != "tensor" && v != "row") bad(f, v, "tensor or row");
      a.rowwise_scales = v == "row";
      scales_given = true;
    } else if (f == "--gather-dim") {
      a.gather_last = parse_dim(f, v);
    } else if (f == "--scatter-dim") {
      a.scatter_last = parse_dim(f, v);
    } else if (f == "--b-layout") {
      if (v != "row" && v != "col") bad(f, v, "row or col");
      a.b_layout = v == "row" ? BLayout::kRowMajor : BLayout::kColMajor;
      b_layout_given = true;
    } else if (f == "--algorithms") {
      a.algorithms.clear();
      if (v.empty()) bad(f, v, "a comma-separated list of sequential, pipelined, fused and auto");
      for (const auto& s : tools::split(v, ',')) a.algorithms.push_back(parse_algorithm(s));
    } else if (f == "--chunks") {
      a.chunks_per_rank = static_cast<int>(parse_int(f, v, 0, kMaxChunksPerRank));
    } else if (f == "--iters") {
      a.iters = static_cast<int>(parse_int(f, v, 1));
    } else if (f == "--warmup") {
      a.warmup = static_cast<int>(parse_int(f, v, 0));
    } else if (f == "--json") {
      if (v.empty()) bad(f, v, "a file to append JSON lines to");
      if (!writable(v)) throw Error("asynctp-bench: --json '" + v + "' cannot be written (" + std::strerror(errno) + ")");
      a.json = v;
    } else {
      throw Error("asynctp-bench: unknown option " + f + " (see --help)");
    }
  }
  if (a.dtype == DType::kFP8E4M3) {
    // The fp8 GEMMs take B column-major only.
    if (b_layout_given && a.b_layout != BLayout::kColMajor) {
      throw Error("asynctp-bench: --b-layout row with --dtype e4m3: fp8 B is column-major only (--b-layout col)");
    }
    a.b_layout = BLayout::kColMajor;
  } else if (scales_given || a.fast_accum || a.bias || out_given) {
    throw Error(std::string("asynctp-bench: ") +
                (scales_given ? "--scales" : a.fast_accum ? "--fast-accum" : a.bias ? "--bias" : "--out-dtype") +
                " is for --dtype e4m3 only");
  }
  return a;
}

}  // namespace asynctp::bench
