// Internal: what Algorithm::kAuto runs for a call. A tuning cache (JSON Lines written by
// asynctp-tune) says what measured fastest for the exact problem on this GPU model and world size;
// where it has no entry, a model estimates each algorithm from a few measured rates (docs/design/auto.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "asynctp/ops.h"
#include "tune/flat_json.h"

namespace asynctp::tune {

enum class Op { kAllGatherMatmul, kMatmulReduceScatter };
const char* op_key(Op op);  // "ag" or "rs", as in the cache and in asynctp-bench's JSON

// A number as the choices' explanations print it: fixed, `digits` after the point.
std::string format_number(double value, int digits = 1);

// What a choice depends on: the cache's key.
struct ProblemKey {
  Op op = Op::kAllGatherMatmul;
  int64_t M = 0, N = 0, K = 0;  // the global problem; N counts every B of an all_gather_matmul
  DType dtype = DType::kBF16;   // A's: bf16, fp16, or fp8 e4m3 (the scaled ops')
  bool last_dim = false;        // gather_dim / scatter_dim last
  int world_size = 1;
  std::string gpu;              // cudaDeviceProp::name, e.g. "NVIDIA H200"
  // Not part of the cache's key: false where the fused kernel cannot take the call whatever its
  // shape (a scaled call's scales, accumulation or types: algo::fused_scaling_unsupported).
  bool fused_kernel = true;
};

// The cache's "dtype" texts: dtype_name's for bf16, fp16 and fp8 e4m3. False for any other text.
bool parse_dtype(const std::string& text, DType& dtype);

// How much faster a GEMM on fp8 e4m3 inputs runs than on 16-bit ones, for the model: cuBLASLt's fp8
// GEMM took 1.66-1.74x less time than cuBLAS's bf16 one at the seed shapes on one H100
// (docs/performance.md). The model's rates are fitted on 16-bit shapes.
inline constexpr double kFp8GemmSpeedup = 1.7;

struct Choice {
  Algorithm algorithm = Algorithm::kSequential;
  int chunks_per_rank = 0;  // 0: the algorithm's default
  bool from_cache = false;
  std::string why;          // one line: the cache entry's time, or the model's estimates
};

// Rates the model estimates with (asynctp-tune measures them; the defaults are 2xH200 figures).
struct Rates {
  double gemm_tflops = 700;       // a large bf16/fp16 GEMM on one GPU
  double gemm_fixed_us = 8;       // what a GEMM costs beyond its FLOPs (launch, last wave)
  double copy_gbps = 300;         // copy engine: bytes a rank receives per second from all peers together
  double nccl_gbps = 300;         // NCCL all-gather / reduce-scatter: bytes received per rank per second
  double nccl_fixed_us = 15;
  double overlap_fixed_us = 12;   // what the overlapped algorithms cost beyond max(GEMM, copy)
  double min_gemm_us = 40;        // below this GEMM time, sequential: nothing worth hiding
};

// An overlapped algorithm is chosen, by the model and by asynctp-tune alike, only where it takes at most
// this fraction of sequential's time: where the two are close, the overlapped ones vary more from call
// to call than NCCL + cuBLASLt does.
inline constexpr double kOverlapAtMost = 0.95;

// An untuned shape that overlaps takes, of the candidates these many nearest tuned shapes measured, the
// one whose worst ratio to the fastest there is least (choose()).
inline constexpr size_t kNearestTunedShapes = 3;

// The model's estimates for one problem, in microseconds.
struct Estimate {
  double gemm_us = 0, copy_us = 0, nccl_us = 0;
  double sequential_us = 0, overlapped_us = 0;
};
Estimate estimate(const ProblemKey& key, const Rates& rates);

// The model's choice: sequential for small problems, and wherever overlapping would not save 5% (which
// includes a GEMM too small beside the copy to be worth hiding); else fused where its kernel takes the
// problem (fused_applies) and the inputs are 16-bit, else pipelined.
Choice model_choice(const ProblemKey& key, const Rates& rates, bool fused_applies);

class TuningCache {
 public:
  // One candidate's time at a tuned shape (the entry's "measured" field: "pipelined/4=237.8 ...").
  struct Measured {
    Algorithm algorithm = Algorithm::kPipelined;
    int chunks_per_rank = 0;
    double us = 0;
  };
  struct Entry {
    ProblemKey key;
    Choice choice;
    std::vector<Measured> measured;  // the overlapped candidates timed there; empty where not recorded
  };

  // Parses JSON Lines text: {"kind":"choice", ...} and {"kind":"rates", ...} lines (docs/design/auto.md);
  // blank lines and lines of other kinds are skipped. Throws asynctp::Error naming `origin` and the
  // line where a line is not valid.
  void add_text(const std::string& text, const std::string& origin);
  const Choice* find(const ProblemKey& key) const;  // the last entry for the key
  // The `count` tuned shapes nearest `key` whose choice overlapped (same op, dtype, dim, world size and
  // GPU model), nearest first; nearness in octaves, M's counted twice.
  std::vector<const Entry*> nearest_overlapped(const ProblemKey& key, size_t count) const;
  // Measured for this GPU model, world size and op where present, else the defaults.
  Rates rates(const std::string& gpu, int world_size, Op op) const;
  size_t size() const { return entries_.size(); }

 private:
  struct RatesEntry {
    std::string gpu;
    int world_size;
    std::string op;  // "ag", "rs", or "" for both
    Rates rates;
  };
  std::vector<Entry> entries_;
  std::vector<RatesEntry> rates_;
};

// The cache auto reads: `path` (CommunicatorOptions::tuning_cache or $ASYNCTP_TUNING_CACHE) on top of
// the one built into the library (tuning/*.jsonl in the repository). Loaded once per path per process.
const TuningCache& tuning_cache(const std::string& path);

// The choice for `key`: the cache's entry; else the model's, whose overlapped choices take the
// algorithm of the candidate that, of those the nearest tuned overlapped shapes measured, loses least
// at the worst of them (the nearest shape's own choice where the cache did not record what it
// measured), with the chunks of a nearest shape of the same M, else the algorithm's default.
Choice choose(const ProblemKey& key, const TuningCache& cache, bool fused_applies);

// The text of the cache built into the library (generated from tuning/*.jsonl at build time).
extern const char* const kBuiltinTuning;

}  // namespace asynctp::tune
