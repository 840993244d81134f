// The C interface's version, options and ops (asynctp/c_api.h): converts its plain structs to the C++
// API's types; every exception becomes -1 and a per-thread message (capi/handles.h). The
// communicators and groups are in c_api_comm.cc.
#include "asynctp/c_api.h"

#include <cstring>
#include <string>
#include <vector>

#include "asynctp/error.h"
#include "asynctp/ops.h"
#include "asynctp/scaled_ops.h"
#include "asynctp/tensor.h"
#include "asynctp/version.h"
#include "capi/handles.h"
#include "common/arg_name.h"
#include "ops/refuse.h"

using namespace asynctp::capi;  // NOLINT: the extern "C" functions below are not in a namespace

namespace {

asynctp::TensorRef to_ref(const asynctp_tensor& t, const char* function, asynctp::detail::ArgName argument) {
  asynctp::TensorRef r;
  switch (t.dtype) {
    case ASYNCTP_BF16: r.dtype = asynctp::DType::kBF16; break;
    case ASYNCTP_FP16: r.dtype = asynctp::DType::kFP16; break;
    case ASYNCTP_FP32: r.dtype = asynctp::DType::kFP32; break;
    case ASYNCTP_FP8E4M3: r.dtype = asynctp::DType::kFP8E4M3; break;
    case ASYNCTP_FP8E5M2: r.dtype = asynctp::DType::kFP8E5M2; break;
    default:
      raise(cat(function, ": ", argument, ".dtype is ", t.dtype, "; expected ASYNCTP_BF16 (0), ASYNCTP_FP16 (1), ",
                "ASYNCTP_FP32 (2), ASYNCTP_FP8E4M3 (3) or ASYNCTP_FP8E5M2 (4)"));
  }
  if (t.ndim < 0 || t.ndim > ASYNCTP_C_MAX_DIMS) {
    raise(cat(function, ": ", argument, ".ndim is ", t.ndim, "; expected 0 to ", ASYNCTP_C_MAX_DIMS));
  }
  static_assert(ASYNCTP_C_MAX_DIMS == asynctp::TensorRef::kMaxDims, "the C and C++ tensor views must agree");
  r.data = t.data;
  r.ndim = t.ndim;
  for (int d = 0; d < t.ndim; ++d) {
    r.shape[d] = t.shape[d];
    r.strides[d] = t.strides[d];
  }
  return r;
}

asynctp::OpOptions to_options(const asynctp_op_options* o, const char* function) {
  asynctp::OpOptions options;
  if (o == nullptr) return options;
  switch (o->algorithm) {
    case ASYNCTP_SEQUENTIAL: options.algorithm = asynctp::Algorithm::kSequential; break;
    case ASYNCTP_PIPELINED: options.algorithm = asynctp::Algorithm::kPipelined; break;
    case ASYNCTP_FUSED: options.algorithm = asynctp::Algorithm::kFused; break;
    case ASYNCTP_AUTO: options.algorithm = asynctp::Algorithm::kAuto; break;
    default:
      raise(cat(function, ": options.algorithm is ", o->algorithm,
                "; expected ASYNCTP_SEQUENTIAL (0), ASYNCTP_PIPELINED (1), ASYNCTP_FUSED (2) or ASYNCTP_AUTO (3)"));
  }
  switch (o->b_layout) {
    case ASYNCTP_ROW_MAJOR: options.b_layout = asynctp::BLayout::kRowMajor; break;
    case ASYNCTP_COL_MAJOR: options.b_layout = asynctp::BLayout::kColMajor; break;
    default:
      raise(cat(function, ": options.b_layout is ", o->b_layout,
                "; expected ASYNCTP_ROW_MAJOR (0) or ASYNCTP_COL_MAJOR (1)"));
  }
  options.check_across_ranks = o->check_across_ranks != 0;
  options.chunks_per_rank = o->chunks_per_rank;
  options.check_pointers = o->check_pointers != 0;
  return options;
}

// An optional tensor: one whose data is NULL is absent.
asynctp::TensorRef optional_ref(const asynctp_tensor& t, const char* function, asynctp::detail::ArgName argument) {
  return t.data == nullptr ? asynctp::TensorRef{} : to_ref(t, function, argument);
}

asynctp::ScaledOpOptions to_scaled_options(const asynctp_op_options* o, int use_fast_accum, const char* function) {
  asynctp::ScaledOpOptions options;
  if (o != nullptr) static_cast<asynctp::OpOptions&>(options) = to_options(o, function);
  if (use_fast_accum != 0 && use_fast_accum != 1) {
    raise(cat(function, ": use_fast_accum is ", use_fast_accum, "; expected 0 or 1"));
  }
  options.use_fast_accum = use_fast_accum == 1;
  return options;
}

asynctp::ReduceOp to_reduce_op(int reduce_op, const char* function) {
  switch (reduce_op) {
    case ASYNCTP_SUM: return asynctp::ReduceOp::kSum;
    case ASYNCTP_AVG: return asynctp::ReduceOp::kAvg;
    default: raise(cat(function, ": reduce_op is ", reduce_op, "; expected ASYNCTP_SUM (0) or ASYNCTP_AVG (1)"));
  }
}

// Where this binding refuses an op's arguments before the op runs, the refusal goes through the op's
// agreement across ranks (ops::refuse_call), so that the peers fail at once instead of waiting.
template <typename Convert>
auto converted_or_refused(asynctp::Communicator& comm, const char* op, cudaStream_t stream,
                          const asynctp_op_options* options, Convert convert) {
  try {
    return convert();
  } catch (const asynctp::Error& e) {
    asynctp::ops::refuse_call(comm, op, e.what(), stream, options == nullptr || options->check_across_ranks != 0);
  }
}

}  // namespace

extern "C" {

int asynctp_c_api_version(void) { return ASYNCTP_C_API_VERSION; }

const char* asynctp_version_string(void) {
  static const std::string text = [] {
    const asynctp::Version v = asynctp::version();
    return cat(v.major, ".", v.minor, ".", v.patch);
  }();
  return text.c_str();
}

const char* asynctp_last_error(void) { return last_error().c_str(); }

void asynctp_op_options_default(asynctp_op_options* o) {
  if (o == nullptr) return;
  const asynctp::OpOptions d;
  o->algorithm = static_cast<int32_t>(d.algorithm);
  o->b_layout = static_cast<int32_t>(d.b_layout);
  o->check_across_ranks = d.check_across_ranks ? 1 : 0;
  o->chunks_per_rank = d.chunks_per_rank;
  o->check_pointers = d.check_pointers ? 1 : 0;
}

int asynctp_all_gather_matmul(asynctp_comm* comm, const asynctp_tensor* a_shard, const asynctp_tensor* bs, int num_bs,
                              int gather_dim, const asynctp_tensor* outputs, const asynctp_tensor* gathered_a,
                              void* stream, const asynctp_op_options* options) {
  return guarded([&] {
    const char* fn = "asynctp_all_gather_matmul";
    const CommUse use(comm, fn);
    asynctp::Communicator& c = use.comm();
    const auto s = static_cast<cudaStream_t>(stream);
    struct Args {
      asynctp::TensorRef a, g;
      std::vector<asynctp::TensorRef> b_refs, out_refs;
      asynctp::OpOptions options;
    };
    const Args args = converted_or_refused(c, "all_gather_matmul", s, options, [&] {
      Args r;
      r.a = to_ref(require(a_shard, fn, "a_shard"), fn, "a_shard");
      if (num_bs < 1) raise(cat(fn, ": num_bs is ", num_bs, "; expected at least 1 (one output per B)"));
      require(bs, fn, "bs");
      require(outputs, fn, "outputs");
      for (int i = 0; i < num_bs; ++i) {
        r.b_refs.push_back(to_ref(bs[i], fn, asynctp::detail::ArgName("bs", i)));
        r.out_refs.push_back(to_ref(outputs[i], fn, asynctp::detail::ArgName("outputs", i)));
      }
      r.g = gathered_a ? to_ref(*gathered_a, fn, "gathered_a") : asynctp::TensorRef{};
      r.options = to_options(options, fn);
      return r;
    });
    asynctp::all_gather_matmul(c, args.a, args.b_refs, gather_dim, args.out_refs, args.g, s, args.options);
  });
}

int asynctp_matmul_reduce_scatter(asynctp_comm* comm, const asynctp_tensor* a, const asynctp_tensor* b, int scatter_dim,
                                  int reduce_op, const asynctp_tensor* output, void* stream,
                                  const asynctp_op_options* options) {
  return guarded([&] {
    const char* fn = "asynctp_matmul_reduce_scatter";
    const CommUse use(comm, fn);
    asynctp::Communicator& c = use.comm();
    const auto s = static_cast<cudaStream_t>(stream);
    struct Args {
      asynctp::ReduceOp op = asynctp::ReduceOp::kSum;
      asynctp::TensorRef a, b, output;
      asynctp::OpOptions options;
    };
    const Args args = converted_or_refused(c, "matmul_reduce_scatter", s, options, [&] {
      Args r;
      r.op = to_reduce_op(reduce_op, fn);
      r.a = to_ref(require(a, fn, "a"), fn, "a");
      r.b = to_ref(require(b, fn, "b"), fn, "b");
      r.output = to_ref(require(output, fn, "output"), fn, "output");
      r.options = to_options(options, fn);
      return r;
    });
    asynctp::matmul_reduce_scatter(c, args.a, args.b, scatter_dim, args.op, args.output, s, args.options);
  });
}

int asynctp_all_gather_scaled_matmul(asynctp_comm* comm, const asynctp_tensor* a_shard, const asynctp_tensor* bs,
                                     int num_bs, const asynctp_tensor* a_scale, const asynctp_tensor* b_scales,
                                     int gather_dim, const asynctp_tensor* outputs, const asynctp_tensor* gathered_a,
                                     void* stream, const asynctp_op_options* options, int use_fast_accum,
                                     const asynctp_tensor* biases, const asynctp_tensor* result_scales) {
  return guarded([&] {
    const char* fn = "asynctp_all_gather_scaled_matmul";
    const CommUse use(comm, fn);
    asynctp::Communicator& c = use.comm();
    const auto s = static_cast<cudaStream_t>(stream);
    struct Args {
      asynctp::TensorRef a, a_scale, g;
      std::vector<asynctp::TensorRef> b_refs, b_scale_refs, out_refs, bias_refs, result_scale_refs;
      asynctp::ScaledOpOptions options;
    };
    const Args args = converted_or_refused(c, "all_gather_scaled_matmul", s, options, [&] {
      Args r;
      r.a = to_ref(require(a_shard, fn, "a_shard"), fn, "a_shard");
      r.a_scale = to_ref(require(a_scale, fn, "a_scale"), fn, "a_scale");
      if (num_bs < 1) raise(cat(fn, ": num_bs is ", num_bs, "; expected at least 1 (one output per B)"));
      require(bs, fn, "bs");
      require(b_scales, fn, "b_scales");
      require(outputs, fn, "outputs");
      for (int i = 0; i < num_bs; ++i) {
        r.b_refs.push_back(to_ref(bs[i], fn, asynctp::detail::ArgName("bs", i)));
        r.b_scale_refs.push_back(to_ref(b_scales[i], fn, asynctp::detail::ArgName("b_scales", i)));
        r.out_refs.push_back(to_ref(outputs[i], fn, asynctp::detail::ArgName("outputs", i)));
        if (biases) r.bias_refs.push_back(optional_ref(biases[i], fn, asynctp::detail::ArgName("biases", i)));
        if (result_scales) {
          r.result_scale_refs.push_back(
              optional_ref(result_scales[i], fn, asynctp::detail::ArgName("result_scales", i)));
        }
      }
      r.g = gathered_a ? to_ref(*gathered_a, fn, "gathered_a") : asynctp::TensorRef{};
      r.options = to_scaled_options(options, use_fast_accum, fn);
      return r;
    });
    asynctp::all_gather_scaled_matmul(c, args.a, args.b_refs, args.a_scale, args.b_scale_refs, gather_dim, args.out_refs,
                                      args.g, s, args.options, args.bias_refs, args.result_scale_refs);
  });
}

int asynctp_scaled_matmul_reduce_scatter(asynctp_comm* comm, const asynctp_tensor* a, const asynctp_tensor* b,
                                         const asynctp_tensor* a_scale, const asynctp_tensor* b_scale, int scatter_dim,
                                         int reduce_op, const asynctp_tensor* output, void* stream,
                                         const asynctp_op_options* options, int use_fast_accum,
                                         const asynctp_tensor* bias, const asynctp_tensor* result_scale) {
  return guarded([&] {
    const char* fn = "asynctp_scaled_matmul_reduce_scatter";
    const CommUse use(comm, fn);
    asynctp::Communicator& c = use.comm();
    const auto s = static_cast<cudaStream_t>(stream);
    struct Args {
      asynctp::ReduceOp op = asynctp::ReduceOp::kSum;
      asynctp::TensorRef a, b, a_scale, b_scale, output, bias, result_scale;
      asynctp::ScaledOpOptions options;
    };
    const Args args = converted_or_refused(c, "scaled_matmul_reduce_scatter", s, options, [&] {
      Args r;
      r.op = to_reduce_op(reduce_op, fn);
      r.a = to_ref(require(a, fn, "a"), fn, "a");
      r.b = to_ref(require(b, fn, "b"), fn, "b");
      r.a_scale = to_ref(require(a_scale, fn, "a_scale"), fn, "a_scale");
      r.b_scale = to_ref(require(b_scale, fn, "b_scale"), fn, "b_scale");
      r.output = to_ref(require(output, fn, "output"), fn, "output");
      r.bias = bias ? optional_ref(*bias, fn, "bias") : asynctp::TensorRef{};
      r.result_scale = result_scale ? optional_ref(*result_scale, fn, "result_scale") : asynctp::TensorRef{};
      r.options = to_scaled_options(options, use_fast_accum, fn);
      return r;
    });
    asynctp::scaled_matmul_reduce_scatter(c, args.a, args.b, args.a_scale, args.b_scale, scatter_dim, args.op,
                                          args.output, s, args.options, args.bias, args.result_scale);
  });
}

int asynctp_refuse_call(asynctp_comm* comm, const char* op, const char* why, void* stream, int check_across_ranks) {
  return guarded([&] {
    const char* fn = "asynctp_refuse_call";
    const CommUse use(comm, fn);
    const std::string name = op == nullptr ? "" : op;
    static const char* const kOps[] = {"all_gather_matmul", "matmul_reduce_scatter", "all_gather_scaled_matmul",
                                       "scaled_matmul_reduce_scatter"};
    const char* known = nullptr;
    for (const char* o : kOps) {
      if (name == o) known = o;
    }
    if (known == nullptr) {
      raise(cat(fn, ": op is '", name, "'; expected all_gather_matmul, matmul_reduce_scatter, ",
                "all_gather_scaled_matmul or scaled_matmul_reduce_scatter"));
    }
    asynctp::ops::refuse_call(use.comm(), known,
                              why == nullptr || *why == '\0' ? cat(name, ": refused by the caller") : std::string(why),
                              static_cast<cudaStream_t>(stream), check_across_ranks != 0);
  });
}

int asynctp_comm_synchronize(const asynctp_comm* comm, void* stream) {
  return guarded([&] {
    CommUse(comm, "asynctp_comm_synchronize").comm().synchronize(static_cast<cudaStream_t>(stream));
  });
}

}  // extern "C"
