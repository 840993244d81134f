// Internal: row-major GEMMs through cuBLASLt, D[M, N] = alpha * A[M, K] @ op(B) + beta * C (C is D
// itself, or another matrix of D's layout), fp32 accumulation and epilogue, with the heuristic's choice cached per problem so repeated calls cost one lookup.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <map>
#include <tuple>

#include "asynctp/ops.h"

namespace asynctp::gemm {

struct Problem {
  int64_t M = 0, N = 0, K = 0;
  DType dtype = DType::kBF16;            // A, B and C
  BLayout b_layout = BLayout::kRowMajor; // B is [K, N] or [N, K]
  int64_t lda = 0, ldb = 0, ldc = 0;     // 0: dense (K, N or K, N)
  float alpha = 1.0f;
  float beta = 0.0f;
  // A scaled GEMM (run_scaled): A and B fp8 (dtype and b_dtype), B column-major, D = (A · a_scale) @
  // (B · b_scale) in out_dtype, the scales tensor-wise or, where rowwise, one per row of A and one per
  // column of D. Where `bias` (run_scaled sets it where it is given a bias), a vector over D's columns
  // is added before the rounding (bf16, or fp16 for an fp16 D); an fp8 D is scaled by its result scale
  // after that, as torch._scaled_mm's scale_result.
  bool scaled = false;
  DType b_dtype = DType::kFP8E4M3, out_dtype = DType::kBF16;
  bool rowwise = false, fast_accum = false, bias = false;
};

// The dtype of a scaled problem's bias: its output's, bf16 for an fp8 output (cuBLASLt's C type there).
inline DType bias_dtype(DType out_dtype) { return out_dtype == DType::kFP16 ? DType::kFP16 : DType::kBF16; }

// A scaled GEMM's pointers beyond A and B: the scales (fp32 on the GPU), and where the problem has
// them, the bias and an fp8 output's result scale (null: 1).
struct ScaledPointers {
  const float* a_scale = nullptr;
  const float* b_scale = nullptr;
  const void* bias = nullptr;
  const float* result_scale = nullptr;
};

class GemmRunner {
 public:
  GemmRunner() = default;
  ~GemmRunner() { reset(); }
  GemmRunner(const GemmRunner&) = delete;
  GemmRunner& operator=(const GemmRunner&) = delete;

  // GEMMs that may run at the same time on different streams need different lanes: each lane has its
  // own cuBLASLt workspace. Lane 0 serves the caller's stream; the pipelined algorithm uses the others.
  static constexpr int kLanes = 3;

  // `handle` is borrowed. A lane's workspace is allocated on its first use (or by reserve()).
  void init(cublasLtHandle_t handle) { handle_ = handle; }
  // d = alpha * a @ op(b) + beta * c, where c is `addend` if given (same layout as d), else d itself.
  void run(const Problem& p, const void* a, const void* b, void* d, cudaStream_t stream, int lane = 0,
           const void* addend = nullptr);
  // d = (a · a_scale) @ (b · b_scale) (+ bias, times an fp8 d's result scale) for a Problem with
  // `scaled` set; the scales are fp32 in device memory (one value each, or vectors where `rowwise`).
  void run_scaled(const Problem& p, const void* a, const void* b, const ScaledPointers& ptrs, void* d,
                  cudaStream_t stream, int lane = 0);
  // Allocates every lane's workspace now, so that later runs allocate nothing (CUDA graph capture).
  void reserve();
  // Called, outside CUDA graph capture, before a GEMM whose plan is new here (or whose lane has no
  // workspace yet) is allocated for and launched: its first launch may load a cuBLAS kernel, which in a
  // process whose ranks are threads can wait for every GPU of the process (Communicator::Impl::quiesce
  // sets it there).
  void set_before_first_launch(std::function<void()> hook) { before_first_launch_ = std::move(hook); }
  // Frees the cached plans and the workspaces (before the cuBLASLt handle goes); the workspaces are
  // forgotten instead where the device may still be busy for good (a broken communicator).
  void reset(bool free_device_memory = true);

 private:
  // Plans cached at most: a job that sees ever new shapes (varying sequence lengths) must not grow
  // without bound; past this the least recently used plan goes.
  static constexpr size_t kMaxPlans = 256;

  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatrixLayout_t d = nullptr;  // an fp8 D's (its C, unread, is bf16); else D's is c
    cublasLtMatmulAlgo_t algo{};
    uint64_t last_use = 0;
  };
  using Key = std::tuple<int64_t, int64_t, int64_t, int, int, int64_t, int64_t, int64_t, bool, bool, int, int, bool, bool, bool>;
  static Key key_of(const Problem& p);
  // A scaled problem's first scale pointers are set before the heuristic is asked (cublaslt_gemm.cc).
  Plan& plan_for(const Problem& p, const ScaledPointers& ptrs = {});
  // A scaled problem's per-call pointers into `desc`.
  static void set_pointers(cublasLtMatmulDesc_t desc, const Problem& p, const ScaledPointers& ptrs);
  static cublasLtMatrixLayout_t d_layout(const Plan& plan) { return plan.d != nullptr ? plan.d : plan.c; }
  static void destroy(const Plan& plan);
  // The lane's workspace, made (and the first-launch hook run) where this is the lane's or the plan's first use.
  void* workspace_for(const Problem& p, cudaStream_t stream, int lane);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_[kLanes] = {};
  std::map<Key, Plan> plans_;
  uint64_t uses_ = 0;
  std::function<void()> before_first_launch_;
};

// The workspace cuBLASLt may use per GEMM (Hopper kernels want up to 32 MiB).
constexpr size_t kGemmWorkspaceBytes = 32u << 20;

}  // namespace asynctp::gemm
