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

// `name`'s number, or `fallback` where the line has no such field (one of another kind is an error).
double number_or(const FlatObject& o, const char* name, double fallback, const std::string& where) {
  return o.count(name) != 0 ? number(o, name, where) : fallback;
}

// `name`'s number where it is a whole number in [lo, hi]: sizes, world sizes and chunk counts, which
// are cast to integers (a fraction, a negative or a huge value would be cut, wrapped or undefined).
int64_t whole(const FlatObject& o, const char* name, int64_t lo, int64_t hi, const std::string& where,
              const double* fallback = nullptr) {
  const double v = fallback != nullptr && o.count(name) == 0 ? *fallback : number(o, name, where);
  if (!(v >= static_cast<double>(lo) && v <= static_cast<double>(hi) && v == std::floor(v))) {
    std::ostringstream s;
    s << where << ": \"" << name << "\" must be a whole number from " << lo << " to " << hi << ", not " << v;
    throw Error(s.str());
  }
  return static_cast<int64_t>(v);
}

// The largest size a line may hold: every whole number up to it is exact in a double.
constexpr int64_t kMaxSize = int64_t{1} << 53;
constexpr int64_t kMaxWorldSize = 1 << 20;

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

// "sequential=483.4 pipelined/0=416.6 fused/2=346.1": asynctp-tune's record of what it measured; the
// overlapped candidates are kept, in order. A token it would not have written is an error.
std::vector<TuningCache::Measured> parse_measured(const std::string& text, const std::string& where) {
  std::vector<TuningCache::Measured> out;
  std::istringstream in(text);
  std::string token;
  while (in >> token) {
    const auto refuse = [&] {
      throw Error(where + ": \"measured\" holds '" + token + "'; expected sequential=US or pipelined/CHUNKS=US or " +
                  "fused/CHUNKS=US, with CHUNKS 0 to " + std::to_string(kMaxChunksPerRank) + " and US > 0");
    };
    const size_t equals = token.find('=');
    if (equals == std::string::npos) refuse();
    const size_t slash = token.find('/');
    char* end = nullptr;
    const double us = std::strtod(token.c_str() + equals + 1, &end);
    if (*end != '\0' || !(us > 0) || !std::isfinite(us)) refuse();
    const std::string name = token.substr(0, std::min(slash, equals));
    if (name == algorithm_name(Algorithm::kSequential) && slash == std::string::npos) continue;
    TuningCache::Measured m;
    if (name == algorithm_name(Algorithm::kPipelined)) {
      m.algorithm = Algorithm::kPipelined;
    } else if (name == algorithm_name(Algorithm::kFused)) {
      m.algorithm = Algorithm::kFused;
    } else {
      refuse();
    }
    if (slash == std::string::npos || slash > equals || slash + 1 == equals) refuse();
    const std::string chunks = token.substr(slash + 1, equals - slash - 1);
    if (chunks.find_first_not_of("0123456789") != std::string::npos || chunks.size() > 2) refuse();
    m.chunks_per_rank = std::stoi(chunks);
    if (m.chunks_per_rank > kMaxChunksPerRank) refuse();
    m.us = us;
    out.push_back(m);
  }
  return out;
}

ProblemKey parse_key(const FlatObject& o, const std::string& where) {
  ProblemKey k;
  k.op = parse_op(text(o, "op", where), where);
  k.M = whole(o, "M", 1, kMaxSize, where);
  k.N = whole(o, "N", 1, kMaxSize, where);
  k.K = whole(o, "K", 1, kMaxSize, where);
  const std::string dt = text(o, "dtype", where);
  if (dt != "bf16" && dt != "fp16") throw Error(where + ": \"dtype\" must be \"bf16\" or \"fp16\"");
  k.dtype = dt == "fp16" ? DType::kFP16 : DType::kBF16;
  const std::string dim = text(o, "dim", where);
  if (dim != "0" && dim != "last") throw Error(where + ": \"dim\" must be \"0\" or \"last\"");
  k.last_dim = dim == "last";
  k.world_size = static_cast<int>(whole(o, "world_size", 1, kMaxWorldSize, where));
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

std::string fmt(double value, int digits = 1) {
  std::ostringstream s;
  s.setf(std::ios::fixed);
  s.precision(digits);
  s << value;
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
    // which on 4 GPUs gave the fused reduce-scatter 0.74-0.83x sequential's time at 12288x7168x4096
    // (docs/performance.md). The communication cannot be hidden where the saving is this small.
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
    // Lines of other kinds (notes) are for people; every line says which kind it is.
    const std::string kind = text(o, "kind", where);
    if (kind == "choice") {
      Entry e;
      e.key = parse_key(o, where);
      e.choice.algorithm = parse_algorithm(text(o, "algorithm", where), where);
      const double no_chunks = 0;
      e.choice.chunks_per_rank = static_cast<int>(whole(o, "chunks_per_rank", 0, kMaxChunksPerRank, where, &no_chunks));
      e.choice.from_cache = true;
      if (o.count("measured") != 0) e.measured = parse_measured(text(o, "measured", where), where);
      e.choice.why = "tuned: " + fmt(number_or(o, "us", 0, where)) + " us (sequential " +
                     fmt(number_or(o, "sequential_us", 0, where)) + " us), " + origin;
      entries_.push_back(std::move(e));
    } else if (kind == "rates") {
      RatesEntry r;
      r.gpu = text(o, "gpu", where);
      r.world_size = static_cast<int>(whole(o, "world_size", 1, kMaxWorldSize, where));
      if (o.count("op") != 0) r.op = op_key(parse_op(text(o, "op", where), where));
      const Rates d;
      // Rates are > 0; fixed costs and the shortest GEMM worth overlapping >= 0.
      const auto rate = [&](const char* name, double fallback, bool positive) {
        const double v = number_or(o, name, fallback, where);
        if (positive ? !(v > 0) : !(v >= 0)) throw Error(where + ": \"" + name + "\" must be " + (positive ? "> 0" : ">= 0"));
        return v;
      };
      r.rates.gemm_tflops = rate("gemm_tflops", d.gemm_tflops, true);
      r.rates.gemm_fixed_us = rate("gemm_fixed_us", d.gemm_fixed_us, false);
      r.rates.copy_gbps = rate("copy_gbps", d.copy_gbps, true);
      r.rates.nccl_gbps = rate("nccl_gbps", d.nccl_gbps, true);
      r.rates.nccl_fixed_us = rate("nccl_fixed_us", d.nccl_fixed_us, false);
      r.rates.overlap_fixed_us = rate("overlap_fixed_us", d.overlap_fixed_us, false);
      r.rates.min_gemm_us = rate("min_gemm_us", d.min_gemm_us, false);
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

std::vector<const TuningCache::Entry*> TuningCache::nearest_overlapped(const ProblemKey& key, size_t count) const {
  std::vector<std::pair<double, const Entry*>> found;
  for (const Entry& e : entries_) {
    const ProblemKey& k = e.key;
    if (e.choice.algorithm == Algorithm::kSequential || k.op != key.op || k.dtype != key.dtype ||
        k.last_dim != key.last_dim || k.world_size != key.world_size || k.gpu != key.gpu) {
      continue;
    }
    // Each shape once, as the line find() reads has it: a file given beside the built-in cache, or
    // measured again with --fresh, supersedes the earlier line rather than adding a second vote (a
    // stale line would otherwise still sway the choice).
    if (find(k) != &e.choice) continue;
    const double d = 2 * std::fabs(std::log2(static_cast<double>(k.M) / key.M)) +
                     std::fabs(std::log2(static_cast<double>(k.N) / key.N)) +
                     std::fabs(std::log2(static_cast<double>(k.K) / key.K));
    found.emplace_back(d, &e);
  }
  // Ties: the earlier line.
  std::stable_sort(found.begin(), found.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  std::vector<const Entry*> out;
  for (size_t i = 0; i < found.size() && i < count; ++i) out.push_back(found[i].second);
  return out;
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

namespace {

std::string shape_name(const ProblemKey& k) {
  return std::to_string(k.M) + "x" + std::to_string(k.N) + "x" + std::to_string(k.K);
}

// What `algorithm` measured fastest at a tuned shape, over the chunk counts timed there; null where the
// entry recorded no time for it.
const TuningCache::Measured* fastest_of(const TuningCache::Entry& e, Algorithm algorithm) {
  const TuningCache::Measured* best = nullptr;
  for (const TuningCache::Measured& m : e.measured) {
    if (m.algorithm == algorithm && (best == nullptr || m.us < best->us)) best = &m;
  }
  return best;
}

// Of the overlapped algorithms timed at every one of `near`, the one whose worst ratio to the fastest
// there is least, each algorithm taken at its fastest chunk count at each shape (ties: the one the
// nearest shape's record names first). False where no overlapped algorithm was timed at all of them.
// An algorithm is judged at its best count because chunks_for chooses the count on its own: judged
// at one count across shapes, an algorithm whose best count moves with the rows (the reduce-scatter's
// pipelined) would lose to one that is slower everywhere but at a steady count.
bool least_regret(const std::vector<const TuningCache::Entry*>& near, bool fused_applies, Algorithm& pick,
                  double& worst_ratio) {
  bool found = false;
  std::vector<Algorithm> judged;
  for (const TuningCache::Measured& first : near.front()->measured) {
    const Algorithm candidate = first.algorithm;
    if (candidate == Algorithm::kSequential || (candidate == Algorithm::kFused && !fused_applies)) continue;
    if (std::find(judged.begin(), judged.end(), candidate) != judged.end()) continue;
    judged.push_back(candidate);
    double worst = 0;
    bool everywhere = true;
    for (const TuningCache::Entry* e : near) {
      const TuningCache::Measured* mine = fastest_of(*e, candidate);
      if (mine == nullptr) {
        everywhere = false;
        break;
      }
      double fastest = mine->us;
      for (const TuningCache::Measured& m : e->measured) fastest = std::min(fastest, m.us);
      worst = std::max(worst, mine->us / fastest);
    }
    if (everywhere && (!found || worst < worst_ratio)) pick = candidate, worst_ratio = worst, found = true;
  }
  return found;
}

// The chunks for `algorithm` at an untuned shape. The nearest tuned shapes say which algorithm overlaps
// best, but the chunks split a rank's rows, and the best count moves with the rows per rank in ways a
// shape of other rows does not predict (docs/design/auto.md: for the two-rank pipelined reduce-scatter 4 at
// 4096 rows per rank, 2-3 at 6144, 2 or 4 at 8192). So a count is carried over only from a nearest
// shape with the same M (the same rows per rank): the one that measured fastest there (its own choice
// where the cache did not record what it measured); else 0, the algorithm's default. `from` names the
// shape it came from.
int chunks_for(const std::vector<const TuningCache::Entry*>& near, const ProblemKey& key, Algorithm algorithm,
               std::string& from) {
  for (const TuningCache::Entry* e : near) {
    if (e->key.M != key.M) continue;
    const TuningCache::Measured* best = fastest_of(*e, algorithm);
    if (best == nullptr && e->choice.algorithm != algorithm) continue;
    from = shape_name(e->key);
    return best != nullptr ? best->chunks_per_rank : e->choice.chunks_per_rank;
  }
  return 0;
}

}  // namespace

Choice choose(const ProblemKey& key, const TuningCache& cache, bool fused_applies) {
  if (const Choice* c = cache.find(key)) return *c;
  Choice c = model_choice(key, cache.rates(key.gpu, key.world_size, key.op), fused_applies);
  if (c.algorithm == Algorithm::kSequential) return c;
  // Whether to overlap is the model's call; how (pipelined or fused, and the chunks), it has no rates
  // for. The nearest tuned shape alone is a poor guide between two regimes (an algorithm fastest above
  // some row count and slower below it: a shape in between would take whichever side is nearer): of
  // what the nearest tuned shapes measured, it takes the algorithm of the candidate that loses least
  // at the worst of them, and the chunks from chunks_for.
  const std::vector<const TuningCache::Entry*> near = cache.nearest_overlapped(key, kNearestTunedShapes);
  if (near.empty()) return c;
  Algorithm pick = Algorithm::kPipelined;
  double worst = 0;
  std::string how;
  if (least_regret(near, fused_applies, pick, worst)) {
    c.algorithm = pick;
    std::string shapes;
    for (const TuningCache::Entry* e : near) shapes += (shapes.empty() ? "" : ", ") + shape_name(e->key);
    how = ": at most " + fmt(worst, 3) + "x the fastest at the nearest tuned shapes (" + shapes + ")";
  } else {
    const TuningCache::Entry* nearest = near.front();  // a cache without the record: its choice
    c.algorithm = nearest->choice.algorithm == Algorithm::kFused && !fused_applies ? Algorithm::kPipelined
                                                                                   : nearest->choice.algorithm;
    how = " as tuned at " + shape_name(nearest->key);
  }
  std::string chunks_from;
  c.chunks_per_rank = chunks_for(near, key, c.algorithm, chunks_from);
  c.why += "; " + std::string(algorithm_name(c.algorithm)) + how + ", with " +
           (chunks_from.empty() ? "its default chunks (no nearest tuned shape has this M)"
                                : std::to_string(c.chunks_per_rank) + " chunks as at " + chunks_from);
  return c;
}

}  // namespace asynctp::tune
