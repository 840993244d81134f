// auto's model and its choice for a call: the cache's entry, else the model's estimates, refined by
// what the nearest tuned shapes measured.
#include "tune/choice.h"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace asynctp::tune {

const char* op_key(Op op) { return op == Op::kAllGatherMatmul ? "ag" : "rs"; }

std::string format_number(double value, int digits) {
  std::ostringstream s;
  s.setf(std::ios::fixed);
  s.precision(digits);
  s << value;
  return s.str();
}

Estimate estimate(const ProblemKey& k, const Rates& r) {
  const double ws = std::max(1, k.world_size);
  const bool fp8 = k.dtype == DType::kFP8E4M3;
  // Bytes an element: A's (ag); the partial sums' (rs), which are the output's, 16-bit for fp8 inputs.
  const bool ag = k.op == Op::kAllGatherMatmul;
  const double es = fp8 && ag ? 1 : 2;
  const double flops = 2.0 * k.M * k.N * k.K / (ag ? 1.0 : ws) / (fp8 ? kFp8GemmSpeedup : 1.0);
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
  const std::string numbers = "model: GEMM " + format_number(e.gemm_us) + " us, copy " + format_number(e.copy_us) + " us, sequential " +
                              format_number(e.sequential_us) + " us, overlapped " + format_number(e.overlapped_us) + " us";
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
    // fp8: the fused kernel's fp8 form was no faster than pipelined at 3 of the 4 all_gather seed
    // shapes on 2xH100 (docs/performance.md); a tuned fp8 shape nearby can still pick it (choose()).
    c.algorithm = fused_applies && key.dtype != DType::kFP8E4M3 ? Algorithm::kFused : Algorithm::kPipelined;
    c.why = numbers;
  }
  return c;
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
    how = ": at most " + format_number(worst, 3) + "x the fastest at the nearest tuned shapes (" + shapes + ")";
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
