#include "tune/choice.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>

#include "asynctp/error.h"

namespace asynctp::tune {
namespace {


const JsonValue& field(const FlatObject& o, const char* name, JsonValue::Kind kind, const std::string& where) {
  const auto it = o.find(name);
  if (it == o.end() || it->second.kind != kind) {
    const char* type = kind == JsonValue::Kind::kString ? "a string" : kind == JsonValue::Kind::kNumber ? "a number" : "a value";
    throw Error(where + ": \"" + name + "\" must be " + type);
  }
  return it->second;
}

std::string text(const FlatObject& o, const char* name, const std::string& where) {
  return field(o, name, JsonValue::Kind::kString, where).text;
}

double number(const FlatObject& o, const char* name, const std::string& where) {
  return field(o, name, JsonValue::Kind::kNumber, where).number;
}

double number_or(const FlatObject& o, const char* name, double fallback) {
  const auto it = o.find(name);
  return it != o.end() && it->second.kind == JsonValue::Kind::kNumber ? it->second.number : fallback;
}

Op parse_op(const std::string& s, const std::string& where) {
  if (s == "ag") return Op::kAllGatherMatmul;
  if (s == "rs") return Op::kMatmulReduceScatter;
  throw Error(where + ": \"op\" must be \"ag\" or \"rs\", not \"" + s + "\"");
}

Algorithm parse_algorithm(const std::string& s, const std::string& where) {
  for (Algorithm a : {Algorithm::kSequential, Algorithm::kPipelined, Algorithm::kFused}) {
    if (s == algorithm_name(a)) return a;
  }
  throw Error(where + ": \"algorithm\" must be sequential, pipelined or fused, not \"" + s + "\"");
}

ProblemKey parse_key(const FlatObject& o, const std::string& where) {
  ProblemKey k;
  k.op = parse_op(text(o, "op", where), where);
  k.M = static_cast<int64_t>(number(o, "M", where));
  k.N = static_cast<int64_t>(number(o, "N", where));
  k.K = static_cast<int64_t>(number(o, "K", where));
  const std::string dt = text(o, "dtype", where);
  if (dt != "bf16" && dt != "fp16") throw Error(where + ": \"dtype\" must be \"bf16\" or \"fp16\"");
  k.dtype = dt == "fp16" ? DType::kFP16 : DType::kBF16;
  const std::string dim = text(o, "dim", where);
  if (dim != "0" && dim != "last") throw Error(where + ": \"dim\" must be \"0\" or \"last\"");
  k.last_dim = dim == "last";
  k.world_size = static_cast<int>(number(o, "world_size", where));
  k.gpu = text(o, "gpu", where);
  return k;
}

bool same_key(const ProblemKey& a, const ProblemKey& b) {
  return a.op == b.op && a.M == b.M && a.N == b.N && a.K == b.K && a.dtype == b.dtype && a.last_dim == b.last_dim &&
         a.world_size == b.world_size && a.gpu == b.gpu;
}

std::string read_tuning_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error("tuning cache '" + path + "' cannot be read (CommunicatorOptions::tuning_cache or ASYNCTP_TUNING_CACHE)");
  std::ostringstream body;
  body << in.rdbuf();
  return body.str();
}

std::string fmt(double us) {
  std::ostringstream s;
  s.setf(std::ios::fixed);
  s.precision(1);
  s << us;
  return s.str();
}

}  // namespace

const char* op_key(Op op) { return op == Op::kAllGatherMatmul ? "ag" : "rs"; }

Estimate estimate(const ProblemKey& k, const Rates& r) {
  const double ws = std::max(1, k.world_size);
  const double es = 2;  // bf16 and fp16
  const bool ag = k.op == Op::kAllGatherMatmul;
  const double flops = 2.0 * k.M * k.N * k.K / (ag ? 1.0 : ws);
  // Bytes each rank receives: the peers' shards of A (ag), or the peers' partial sums of its rows (rs).
  const double bytes = (ag ? static_cast<double>(k.M) * k.K : static_cast<double>(k.M) * k.N) * es * (ws - 1) / ws;
  Estimate e;
  e.gemm_us = flops / (r.gemm_tflops * 1e6) + r.gemm_fixed_us;
  e.copy_us = bytes / (r.copy_gbps * 1e3);
  e.nccl_us = bytes / (r.nccl_gbps * 1e3) + r.nccl_fixed_us;
  e.sequential_us = e.gemm_us + e.nccl_us;
  // The last rank's rows (ag) or this rank's own rows (rs) are multiplied after the copy they wait for
  // (or that waits for them), so one rank's share of the GEMM does not overlap.
  e.overlapped_us = std::max(e.gemm_us, e.copy_us + e.gemm_us / ws) + r.overlap_fixed_us;
  return e;
}

Choice model_choice(const ProblemKey& key, const Rates& rates, bool fused_applies) {
  Choice c;
  const Estimate e = estimate(key, rates);
  const std::string numbers = "model: GEMM " + fmt(e.gemm_us) + " us, copy " + fmt(e.copy_us) + " us, sequential " +
                              fmt(e.sequential_us) + " us, overlapped " + fmt(e.overlapped_us) + " us";
  if (key.world_size <= 1) {
    c.why = "one rank: nothing to communicate";
  } else if (e.gemm_us < rates.min_gemm_us) {
    c.why = numbers + ": a GEMM this short leaves nothing worth hiding";
  } else if (e.overlapped_us > kOverlapAtMost * e.sequential_us) {
    // Not "wherever the copy outlasts the GEMM": overlapping then still hides the GEMM behind the copy,
    // which on 4 GPUs made the fused reduce-scatter 26% faster than sequential at 12288x7168x4096
    // (docs/benchmarks.md). The communication cannot be hidden where the saving is this small.
    c.why = numbers + (e.copy_us > e.gemm_us ? ": the communication cannot hide behind the GEMM; overlapping would "
                                               "save under 5%"
                                             : ": overlapping would save under 5%");
  } else {
    c.algorithm = fused_applies ? Algorithm::kFused : Algorithm::kPipelined;
    c.why = numbers;
  }
  return c;
}

void TuningCache::add_text(const std::string& body, const std::string& origin) {
  std::istringstream in(body);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = origin + ", line " + std::to_string(n);
    FlatObject o;
    std::string error;
    if (!parse_flat_object(line, o, error)) throw Error(where + ": not a flat JSON object: " + error);
    const auto kind = o.find("kind");
    if (kind == o.end() || kind->second.kind != JsonValue::Kind::kString) continue;
    if (kind->second.text == "choice") {
      Entry e;
      e.key = parse_key(o, where);
      e.choice.algorithm = parse_algorithm(text(o, "algorithm", where), where);
      e.choice.chunks_per_rank = static_cast<int>(number_or(o, "chunks_per_rank", 0));
      if (e.choice.chunks_per_rank < 0 || e.choice.chunks_per_rank > kMaxChunksPerRank) {
        throw Error(where + ": \"chunks_per_rank\" must be 0 to " + std::to_string(kMaxChunksPerRank));
      }
      e.choice.from_cache = true;
      e.choice.why = "tuned: " + fmt(number_or(o, "us", 0)) + " us (sequential " + fmt(number_or(o, "sequential_us", 0)) +
                     " us), " + origin;
      entries_.push_back(std::move(e));
    } else if (kind->second.text == "rates") {
      RatesEntry r;
      r.gpu = text(o, "gpu", where);
      r.world_size = static_cast<int>(number(o, "world_size", where));
      const auto op = o.find("op");
      if (op != o.end()) r.op = op_key(parse_op(op->second.text, where));
      Rates d;
      r.rates.gemm_tflops = number_or(o, "gemm_tflops", d.gemm_tflops);
      r.rates.gemm_fixed_us = number_or(o, "gemm_fixed_us", d.gemm_fixed_us);
      r.rates.copy_gbps = number_or(o, "copy_gbps", d.copy_gbps);
      r.rates.nccl_gbps = number_or(o, "nccl_gbps", d.nccl_gbps);
      r.rates.nccl_fixed_us = number_or(o, "nccl_fixed_us", d.nccl_fixed_us);
      r.rates.overlap_fixed_us = number_or(o, "overlap_fixed_us", d.overlap_fixed_us);
      r.rates.min_gemm_us = number_or(o, "min_gemm_us", d.min_gemm_us);
      if (!(r.rates.gemm_tflops > 0 && r.rates.copy_gbps > 0 && r.rates.nccl_gbps > 0)) {
        throw Error(where + ": rates must be positive");
      }
      rates_.push_back(std::move(r));
    }
  }
}

const Choice* TuningCache::find(const ProblemKey& key) const {
  for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) {
    if (same_key(it->key, key)) return &it->choice;
  }
  return nullptr;
}

const TuningCache::Entry* TuningCache::nearest_overlapped(const ProblemKey& key) const {
  const Entry* best = nullptr;
  double best_distance = 0;
  for (const Entry& e : entries_) {
    const ProblemKey& k = e.key;
    if (e.choice.algorithm == Algorithm::kSequential || k.op != key.op || k.dtype != key.dtype ||
        k.last_dim != key.last_dim || k.world_size != key.world_size || k.gpu != key.gpu) {
      continue;
    }
    const double d = 2 * std::fabs(std::log2(static_cast<double>(k.M) / key.M)) +
                     std::fabs(std::log2(static_cast<double>(k.N) / key.N)) +
                     std::fabs(std::log2(static_cast<double>(k.K) / key.K));
    if (best == nullptr || d < best_distance) best = &e, best_distance = d;  // ties: the earlier line
  }
  return best;
}

Rates TuningCache::rates(const std::string& gpu, int world_size, Op op) const {
  for (auto it = rates_.rbegin(); it != rates_.rend(); ++it) {
    if (it->gpu == gpu && it->world_size == world_size && (it->op.empty() || it->op == op_key(op))) return it->rates;
  }
  return Rates{};
}

const TuningCache& tuning_cache(const std::string& path) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<TuningCache>> loaded;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = loaded[path];
  if (!slot) {
    auto cache = std::make_unique<TuningCache>();
    cache->add_text(kBuiltinTuning, "the built-in tuning cache");
    if (!path.empty()) cache->add_text(read_tuning_file(path), path);
    slot = std::move(cache);
  }
  return *slot;
}

Choice choose(const ProblemKey& key, const TuningCache& cache, bool fused_applies) {
  if (const Choice* c = cache.find(key)) return *c;
  Choice c = model_choice(key, cache.rates(key.gpu, key.world_size, key.op), fused_applies);
  if (c.algorithm == Algorithm::kSequential) return c;
  // Whether to overlap is the model's call; how (pipelined or fused, and the pieces), it has no rates
  // for, so it follows what measured fastest at the nearest tuned shape that overlapped.
  if (const TuningCache::Entry* near = cache.nearest_overlapped(key)) {
    c.algorithm = near->choice.algorithm == Algorithm::kFused && !fused_applies ? Algorithm::kPipelined
                                                                                : near->choice.algorithm;
    c.chunks_per_rank = near->choice.chunks_per_rank;
    c.why += "; " + std::string(algorithm_name(c.algorithm)) + " with " + std::to_string(c.chunks_per_rank) +
             " pieces as tuned at " + std::to_string(near->key.M) + "x" + std::to_string(near->key.N) + "x" +
             std::to_string(near->key.K);
  }
  return c;
}

}  // namespace asynctp::tune
