#include "gemm/cublaslt_gemm.h"

#include "common/check.h"

namespace asynctp::gemm {
namespace {

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kFP16: return CUDA_R_16F;
    case DType::kFP32: return CUDA_R_32F;
    case DType::kFP8E4M3: return CUDA_R_8F_E4M3;
    case DType::kFP8E5M2: return CUDA_R_8F_E5M2;
  }
  return CUDA_R_32F;
}

void destroy(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c) {
  // cuBLASLt reads the descriptors when a GEMM is enqueued, not when it runs: enqueued work keeps going.
  cublasLtMatrixLayoutDestroy(a);
  cublasLtMatrixLayoutDestroy(b);
  cublasLtMatrixLayoutDestroy(c);
  cublasLtMatmulDescDestroy(desc);
}

}  // namespace

void GemmRunner::reset(bool free_device_memory) {
  for (auto& [key, plan] : plans_) destroy(plan.desc, plan.a, plan.b, plan.c);
  plans_.clear();
  for (void*& w : workspace_) {
    if (w && free_device_memory) cudaFree(w);
    w = nullptr;
  }
}

void GemmRunner::reserve() {
  for (void*& w : workspace_) {
    if (w == nullptr) ASYNCTP_CUDA_CHECK(cudaMalloc(&w, kGemmWorkspaceBytes));
  }
}

// cuBLASLt is column-major; a row-major C[M, N] is a column-major C^T[N, M], so it computes
// C^T = op(B)^T A^T: Lt's "A" is our B, Lt's "B" is our A.
GemmRunner::Key GemmRunner::key_of(const Problem& p) {
  const bool col = p.b_layout == BLayout::kColMajor;
  const int64_t lda = p.lda ? p.lda : p.K;
  const int64_t ldb = p.ldb ? p.ldb : (col ? p.K : p.N);
  const int64_t ldc = p.ldc ? p.ldc : p.N;
  return Key{p.M,       p.N,       p.K, static_cast<int>(p.dtype), static_cast<int>(p.b_layout), lda, ldb, ldc,
             p.beta != 0.0f, p.scaled, p.scaled ? static_cast<int>(p.b_dtype) : 0,
             p.scaled ? static_cast<int>(p.out_dtype) : 0, p.scaled && p.rowwise, p.scaled && p.fast_accum};
}

GemmRunner::Plan& GemmRunner::plan_for(const Problem& p, const float* a_scale, const float* b_scale) {
  const bool col = p.b_layout == BLayout::kColMajor;
  const Key key = key_of(p);
  const int64_t lda = std::get<5>(key), ldb = std::get<6>(key), ldc = std::get<7>(key);
  auto it = plans_.find(key);
  if (it != plans_.end()) {
    it->second.last_use = ++uses_;
    return it->second;
  }
  if (plans_.size() >= kMaxPlans) {
    auto oldest = plans_.begin();
    for (auto i = plans_.begin(); i != plans_.end(); ++i) {
      if (i->second.last_use < oldest->second.last_use) oldest = i;
    }
    destroy(oldest->second.desc, oldest->second.a, oldest->second.b, oldest->second.c);
    plans_.erase(oldest);
  }

  Plan plan;
  const cudaDataType_t type = cuda_type(p.dtype);
  ASYNCTP_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t trans_b = col ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t no_trans = CUBLAS_OP_N;
  ASYNCTP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_b, sizeof trans_b));
  ASYNCTP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &no_trans, sizeof no_trans));
  if (p.scaled) {
    // Lt's A is our B, so its scale is b_scale and Lt's B's is a_scale (set per call, run_scaled). Row-wise,
    // each is a vector along the dim that is not summed over: Lt A's rows are D's columns, Lt B's
    // columns are A's rows.
    if (p.rowwise) {
      const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
      ASYNCTP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof mode));
      ASYNCTP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof mode));
    }
    const int8_t fast = p.fast_accum ? 1 : 0;
    ASYNCTP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast));
    // The heuristic offers no outer-vector (row-wise) algorithm while the scale pointers are unset
    // (cuBLASLt 13.1 on H100), so the first call's are set here; run_scaled sets each call's own.
    ASYNCTP_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &b_scale, sizeof b_scale));
    ASYNCTP_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a_scale, sizeof a_scale));
  }
  // Lt's A = our B: [N, K] (no transpose) for row-major B, [K, N] transposed for column-major B.
  const cudaDataType_t b_type = p.scaled ? cuda_type(p.b_dtype) : type;
  const cudaDataType_t d_type = p.scaled ? cuda_type(p.out_dtype) : type;
  ASYNCTP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.a, b_type, col ? p.K : p.N, col ? p.N : p.K, ldb));
  ASYNCTP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.b, type, p.K, p.M, lda));
  ASYNCTP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.c, d_type, p.N, p.M, ldc));

  cublasLtMatmulPreference_t pref;
  ASYNCTP_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const size_t ws = kGemmWorkspaceBytes;
  ASYNCTP_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(handle_, plan.desc, plan.a, plan.b, plan.c, plan.c, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
    cublasLtMatrixLayoutDestroy(plan.a);
    cublasLtMatrixLayoutDestroy(plan.b);
    cublasLtMatrixLayoutDestroy(plan.c);
    cublasLtMatmulDescDestroy(plan.desc);
    detail::raise(detail::cat("cuBLASLt has no algorithm for a ", dtype_name(p.dtype),
                              p.scaled ? detail::cat(" x ", dtype_name(p.b_dtype), " -> ", dtype_name(p.out_dtype),
                                                     p.rowwise ? " row-wise" : " tensor-wise", " scaled")
                                       : std::string(),
                              " GEMM M=", p.M, " N=", p.N, " K=", p.K, " (lda ", lda, ", ldb ", ldb, ", ldc ", ldc, ")"));
  }
  plan.algo = result.algo;
  plan.last_use = ++uses_;
  return plans_.emplace(key, plan).first->second;
}

void* GemmRunner::workspace_for(const Problem& p, cudaStream_t stream, int lane) {
  ASYNCTP_CHECK(handle_ != nullptr, "GemmRunner used before init()");
  ASYNCTP_CHECK(lane >= 0 && lane < kLanes, "GemmRunner::run: lane must be in [0, ", kLanes, "), got ", lane);
  void*& workspace = workspace_[lane];
  if (before_first_launch_ && (workspace == nullptr || plans_.count(key_of(p)) == 0)) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    ASYNCTP_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
    if (capture == cudaStreamCaptureStatusNone) before_first_launch_();
  }
  if (workspace == nullptr) ASYNCTP_CUDA_CHECK(cudaMalloc(&workspace, kGemmWorkspaceBytes));
  return workspace;
}

void GemmRunner::run_scaled(const Problem& p, const void* a, const float* a_scale, const void* b, const float* b_scale,
                            void* d, cudaStream_t stream, int lane) {
  ASYNCTP_CHECK(p.scaled, "GemmRunner::run_scaled: the problem is not scaled");
  void* workspace = workspace_for(p, stream, lane);
  Plan& plan = plan_for(p, a_scale, b_scale);
  ASYNCTP_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &b_scale, sizeof b_scale));
  ASYNCTP_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a_scale, sizeof a_scale));
  const float alpha = 1.0f, beta = 0.0f;
  ASYNCTP_CUBLAS_CHECK(cublasLtMatmul(handle_, plan.desc, &alpha, b, plan.a, a, plan.b, &beta, d, plan.c, d, plan.c,
                                      &plan.algo, workspace, kGemmWorkspaceBytes, stream));
}

void GemmRunner::run(const Problem& p, const void* a, const void* b, void* d, cudaStream_t stream, int lane,
                     const void* addend) {
  ASYNCTP_CHECK(!p.scaled, "GemmRunner::run: a scaled problem goes to run_scaled");
  void* workspace = workspace_for(p, stream, lane);
  Plan& plan = plan_for(p);
  const void* c = addend ? addend : d;
  ASYNCTP_CUBLAS_CHECK(cublasLtMatmul(handle_, plan.desc, &p.alpha, b, plan.a, a, plan.b, &p.beta, c, plan.c, d, plan.c,
                                      &plan.algo, workspace, kGemmWorkspaceBytes, stream));
}

}  // namespace asynctp::gemm
