// The tuning cache: its JSON Lines parsed and checked line by line, its lookups, and the one a
// communicator reads (the built-in cache with a file on top).
#include "tune/choice.h"

#include <algorithm>
#include <cmath>
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
  if (!parse_dtype(text(o, "dtype", where), k.dtype)) {
    throw Error(where + ": \"dtype\" must be \"bf16\", \"fp16\" or \"fp8 e4m3\"");
  }
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

}  // namespace

bool parse_dtype(const std::string& text, DType& dtype) {
  for (DType d : {DType::kBF16, DType::kFP16, DType::kFP8E4M3}) {
    if (text == dtype_name(d)) {
      dtype = d;
      return true;
    }
  }
  return false;
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
      e.choice.why = "tuned: " + format_number(number_or(o, "us", 0, where)) + " us (sequential " +
                     format_number(number_or(o, "sequential_us", 0, where)) + " us), " + origin;
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

}  // namespace asynctp::tune
