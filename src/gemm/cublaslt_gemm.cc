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

bool is_fp8(DType t) { return t == DType::kFP8E4M3 || t == DType::kFP8E5M2; }

}  // namespace

void GemmRunner::destroy(const Plan& plan) {
  // cuBLASLt reads the descriptors when a GEMM is enqueued, not when it runs: enqueued work keeps going.
  cublasLtMatrixLayoutDestroy(plan.a);
  cublasLtMatrixLayoutDestroy(plan.b);
  cublasLtMatrixLayoutDestroy(plan.c);
  if (plan.d != nullptr) cublasLtMatrixLayoutDestroy(plan.d);
  cublasLtMatmulDescDestroy(plan.desc);
}

void GemmRunner::reset(bool free_device_memory) {
  for (auto& [key, plan] : plans_) destroy(plan);
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
             p.scaled ? static_cast<int>(p.out_dtype) : 0, p.scaled && p.rowwise, p.scaled && p.fast_accum,
             p.scaled && p.bias};
}

GemmRunner::Plan& GemmRunner::plan_for(const Problem& p, const ScaledPointers& ptrs) {
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
    destroy(oldest->second);
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
    if (p.bias) {
      // Lt's D is our D transposed: its rows are our columns, along which the bias runs.
      const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
      const cudaDataType_t bias_type = cuda_type(bias_dtype(p.out_dtype));
      ASYNCTP_CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
      ASYNCTP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                          sizeof bias_type));
    }
    // The heuristic offers no outer-vector (row-wise) algorithm while the scale pointers are unset
    // (cuBLASLt 13.1 on H100), so the first call's are set here; run_scaled sets each call's own.
    set_pointers(plan.desc, p, ptrs);
  }
  // Lt's A = our B: [N, K] (no transpose) for row-major B, [K, N] transposed for column-major B.
  const cudaDataType_t b_type = p.scaled ? cuda_type(p.b_dtype) : type;
  const cudaDataType_t d_type = p.scaled ? cuda_type(p.out_dtype) : type;
  // An fp8 D takes a 16-bit C (bf16; with beta 0 it is never read).
  const bool fp8_d = p.scaled && is_fp8(p.out_dtype);
  ASYNCTP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.a, b_type, col ? p.K : p.N, col ? p.N : p.K, ldb));
  ASYNCTP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.b, type, p.K, p.M, lda));
  ASYNCTP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.c, fp8_d ? CUDA_R_16BF : d_type, p.N, p.M, ldc));
  if (fp8_d) ASYNCTP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.d, d_type, p.N, p.M, ldc));

  cublasLtMatmulPreference_t pref;
  ASYNCTP_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const size_t ws = kGemmWorkspaceBytes;
  ASYNCTP_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(handle_, plan.desc, plan.a, plan.b, plan.c, d_layout(plan), pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
    destroy(plan);
    detail::raise(detail::cat("cuBLASLt has no algorithm for a ", dtype_name(p.dtype),
                              p.scaled ? detail::cat(" x ", dtype_name(p.b_dtype), " -> ", dtype_name(p.out_dtype),
                                                     p.rowwise ? " row-wise" : " tensor-wise", " scaled",
                                                     p.bias ? " with a bias" : "")
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

void GemmRunner::set_pointers(cublasLtMatmulDesc_t desc, const Problem& p, const ScaledPointers& ptrs) {
  ASYNCTP_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &ptrs.b_scale, sizeof ptrs.b_scale));
  ASYNCTP_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &ptrs.a_scale, sizeof ptrs.a_scale));
  if (p.bias) {
    ASYNCTP_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &ptrs.bias, sizeof ptrs.bias));
  }
  if (is_fp8(p.out_dtype)) {
    ASYNCTP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, &ptrs.result_scale,
                                                        sizeof ptrs.result_scale));
  }
}

void GemmRunner::run_scaled(const Problem& p, const void* a, const void* b, const ScaledPointers& ptrs, void* d,
                            cudaStream_t stream, int lane) {
  ASYNCTP_CHECK(p.scaled, "GemmRunner::run_scaled: the problem is not scaled");
  Problem q = p;
  q.bias = ptrs.bias != nullptr;
  void* workspace = workspace_for(q, stream, lane);
  Plan& plan = plan_for(q, ptrs);
  set_pointers(plan.desc, q, ptrs);
  const float alpha = 1.0f, beta = 0.0f;
  // With beta 0, C is never read; an fp8 D's C (of another type) must not be D, which cuBLASLt would
  // take for an in-place product with descriptors that differ.
  const void* c = plan.d != nullptr ? nullptr : d;
  ASYNCTP_CUBLAS_CHECK(cublasLtMatmul(handle_, plan.desc, &alpha, b, plan.a, a, plan.b, &beta, c, plan.c, d,
                                      d_layout(plan), &plan.algo, workspace, kGemmWorkspaceBytes, stream));
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
