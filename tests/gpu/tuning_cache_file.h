// GPU tests' tuning caches: a file of a rank's own with given lines, a communicator that reads it,
// and a choice line for this GPU model and world size.
#pragma once

#include <unistd.h>

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "gpu_test.h"

namespace asynctp::testing {

inline std::unique_ptr<Communicator> comm_with_cache(const RankContext& ctx, const std::string& path) {
  CommunicatorOptions o;
  o.device = ctx.device;
  o.tuning_cache = path;
  return Communicator::create(ctx, o);
}

// A cache file of this process's and rank's own, with `lines`.
inline std::string write_cache(const RankContext& ctx, const std::vector<std::string>& lines) {
  const std::string path = "/tmp/asynctp_auto_test_" + std::to_string(getpid()) + "_" + std::to_string(ctx.rank) + ".jsonl";
  std::ofstream out(path);
  for (const auto& l : lines) out << l << "\n";
  return path;
}

// The GPU's name as the communicator will report it (one NCCL id makes one communicator per process,
// so the test cannot ask a communicator before it makes the one it uses).
inline std::string gpu_name(const RankContext& ctx) {
  cudaDeviceProp prop{};
  RANK_CUDA(cudaGetDeviceProperties(&prop, ctx.device));
  return prop.name;
}

// A "choice" line for this GPU model and world size; `dtype` as the cache spells it.
inline std::string choice_line(const RankContext& ctx, const char* op, int64_t M, int64_t N, int64_t K,
                               const char* algorithm, int chunks, const char* dtype = "bf16") {
  return std::string("{\"kind\":\"choice\",\"gpu\":\"") + gpu_name(ctx) + "\",\"world_size\":" +
         std::to_string(ctx.world_size) + ",\"op\":\"" + op + "\",\"dtype\":\"" + dtype + "\",\"dim\":\"0\",\"M\":" +
         std::to_string(M) + ",\"N\":" + std::to_string(N) + ",\"K\":" + std::to_string(K) + ",\"algorithm\":\"" +
         algorithm + "\",\"chunks_per_rank\":" + std::to_string(chunks) + ",\"us\":1}";
}

}  // namespace asynctp::testing
