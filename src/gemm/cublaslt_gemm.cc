#include "gemm/cublaslt_gemm.h"

#include "common/check.h"

namespace asynctp::gemm {
namespace {

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kFP16: return CUDA_R_16F;
    case DType::kFP32: return CUDA_R_32F;
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
  return Key{p.M, p.N, p.K, static_cast<int>(p.dtype), static_cast<int>(p.b_layout), lda, ldb, ldc, p.beta != 0.0f};
}

GemmRunner::Plan& GemmRunner::plan_for(const Problem& p) {
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
  // Lt's A = our B: [N, K] (no transpose) for row-major B, [K, N] transposed for column-major B.
  ASYNCTP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.a, type, col ? p.K : p.N, col ? p.N : p.K, ldb));
  ASYNCTP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.b, type, p.K, p.M, lda));
  ASYNCTP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.c, type, p.N, p.M, ldc));

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
    detail::raise(detail::cat("cuBLASLt has no algorithm for a ", dtype_name(p.dtype), " GEMM M=", p.M, " N=", p.N,
                              " K=", p.K, " (lda ", lda, ", ldb ", ldb, ", ldc ", ldc, ")"));
  }
  plan.algo = result.algo;
  plan.last_use = ++uses_;
  return plans_.emplace(key, plan).first->second;
}

void GemmRunner::run(const Problem& p, const void* a, const void* b, void* d, cudaStream_t stream, int lane,
                     const void* addend) {
  ASYNCTP_CHECK(handle_ != nullptr, "GemmRunner used before init()");
  ASYNCTP_CHECK(lane >= 0 && lane < kLanes, "GemmRunner::run: lane must be in [0, ", kLanes, "), got ", lane);
  void*& workspace = workspace_[lane];
  if (before_first_launch_ && (workspace == nullptr || plans_.count(key_of(p)) == 0)) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    ASYNCTP_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
    if (capture == cudaStreamCaptureStatusNone) before_first_launch_();
  }
  if (workspace == nullptr) ASYNCTP_CUDA_CHECK(cudaMalloc(&workspace, kGemmWorkspaceBytes));
  Plan& plan = plan_for(p);
  const void* c = addend ? addend : d;
  ASYNCTP_CUBLAS_CHECK(cublasLtMatmul(handle_, plan.desc, &p.alpha, b, plan.a, a, plan.b, &p.beta, c, plan.c, d, plan.c,
                                      &plan.algo, workspace, kGemmWorkspaceBytes, stream));
}

}  // namespace asynctp::gemm
