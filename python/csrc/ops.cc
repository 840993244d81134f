#include "ops.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <string>
#include <utility>

#include "library.h"
#include "shapes.h"

namespace asynctp::torch_ext {
namespace {

// The library's view of `t` (named `name`, with `index` appended where it is not negative, in a refusal).
asynctp_tensor ref(const at::Tensor& t, const char* op, const char* name, int64_t index = -1) {
  asynctp_tensor r{};
  switch (t.scalar_type()) {
    case at::kBFloat16: r.dtype = ASYNCTP_BF16; break;
    case at::kHalf: r.dtype = ASYNCTP_FP16; break;
    case at::kFloat: r.dtype = ASYNCTP_FP32; break;
    default:
      refuse(op, ": ", name, index >= 0 ? "[" + std::to_string(index) + "]" : std::string(), " is torch.",
             c10::getDtypeNames(t.scalar_type()).first, "; expected torch.bfloat16 or torch.float16");
  }
  if (t.dim() > ASYNCTP_C_MAX_DIMS) refuse("a tensor of ", t.dim(), " dims; asynctp takes at most ", ASYNCTP_C_MAX_DIMS);
  r.data = t.data_ptr();
  r.ndim = static_cast<int32_t>(t.dim());
  for (int64_t d = 0; d < t.dim(); ++d) {
    r.shape[d] = t.size(d);
    r.strides[d] = t.stride(d);
  }
  return r;
}

// The view of B [K, N] that the library takes for `layout`: B itself (row-major), or B's transpose
// [N, K] (column-major), its dims swapped without making a tensor of it.
asynctp_tensor b_ref(const at::Tensor& b, int32_t layout, const char* op, const char* name, int64_t index) {
  asynctp_tensor r = ref(b, op, name, index);
  if (layout == ASYNCTP_COL_MAJOR) {
    std::swap(r.shape[0], r.shape[1]);
    std::swap(r.strides[0], r.strides[1]);
  }
  return r;
}

asynctp_op_options options(const char* op, std::string_view algorithm, int64_t chunks_per_rank, int32_t b_layout) {
  asynctp_op_options o{};
  if (algorithm == "sequential") {
    o.algorithm = ASYNCTP_SEQUENTIAL;
  } else if (algorithm == "pipelined") {
    o.algorithm = ASYNCTP_PIPELINED;
  } else if (algorithm == "fused") {
    o.algorithm = ASYNCTP_FUSED;
  } else if (algorithm == "auto") {
    o.algorithm = ASYNCTP_AUTO;
  } else {
    refuse(op, ": algorithm is '", algorithm, "'; expected one of sequential, pipelined, fused, auto");
  }
  o.b_layout = b_layout;
  o.check_across_ranks = 1;
  o.chunks_per_rank = static_cast<int32_t>(chunks_per_rank);
  // Every tensor's device is checked here (check_device; the outputs are made on A's), so the library
  // need not look each pointer up with CUDA again.
  o.check_pointers = 0;
  return o;
}

// (layout, the Bs as passed, each [K, N]). B = W.t() of a contiguous nn.Linear weight W goes
// column-major, as W, without a copy; a B that is neither layout is copied.
std::pair<int32_t, std::vector<at::Tensor>> b_operands(at::TensorList bs, const char* op, const char* name) {
  for (size_t i = 0; i < bs.size(); ++i) {
    if (bs[i].dim() != 2) refuse(op, ": ", name, "[", i, "] has ", bs[i].dim(), " dims; expected 2 ([K, N])");
  }
  // Whether B's transpose [N, K] is contiguous (dims of size 1 may have any stride), as torch says it.
  auto col_major = [](const at::Tensor& b) {
    const int64_t k = b.size(0), n = b.size(1);
    return k * n == 0 || ((k == 1 || b.stride(0) == 1) && (n == 1 || b.stride(1) == k));
  };
  const bool col = !bs[0].is_contiguous() && col_major(bs[0]);
  std::vector<at::Tensor> out;
  out.reserve(bs.size());
  for (const at::Tensor& b : bs) {
    if (col) {
      out.push_back(col_major(b) ? b : b.t().contiguous().t());
    } else {
      out.push_back(b.contiguous());
    }
  }
  return {col ? ASYNCTP_COL_MAJOR : ASYNCTP_ROW_MAJOR, std::move(out)};
}

void check_device(const Group& g, const at::Tensor& t, const char* op, const char* name, int64_t index = -1) {
  if (t.get_device() != g.device) {
    refuse(op, ": ", name, index >= 0 ? "[" + std::to_string(index) + "]" : std::string(), " is on ", t.device(),
           "; the communicator of its group was made on cuda:", g.device,
           " (the current device when the group's first asynctp op ran)");
  }
}

// Runs this rank's own checks of a call (`step`); a refusal goes through the op's agreement across
// ranks (asynctp_refuse_call), so that the other ranks' calls fail at once instead of timing out.
template <typename Step>
void unless_refused(const Group& g, const char* op, void* stream, Step step) {
  try {
    step();
  } catch (const Refusal& r) {
    c_functions().refuse_call(g.comm, op, r.what.c_str(), stream, 1);
    TORCH_CHECK(false, r.what);
  }
}

}  // namespace

AllGatherResult all_gather_matmul_cuda(const at::Tensor& a_shard, at::TensorList bs, int64_t gather_dim,
                                       std::string_view group_name, bool return_a, std::string_view algorithm,
                                       int64_t chunks_per_rank) {
  const char* op = "all_gather_matmul";
  const Group g = group(std::string(group_name));
  void* stream = c10::cuda::getCurrentCUDAStream(a_shard.get_device()).stream();
  std::optional<AllGatherShapes> shapes;
  asynctp_tensor a_ref{}, gathered_ref{};
  std::vector<asynctp_tensor> b_refs, out_refs;
  std::vector<at::Tensor> b_ops, outs;
  std::optional<at::Tensor> a_full;
  asynctp_op_options opt{};
  unless_refused(g, op, stream, [&] {
    if (bs.empty()) refuse(op, ": bs is empty; expected at least one B");
    shapes.emplace(a_shard, gather_dim, g.world_size);
    check_device(g, a_shard, op, "a_shard");
    for (size_t i = 0; i < bs.size(); ++i) check_device(g, bs[i], op, "bs", static_cast<int64_t>(i));
    a_ref = ref(shapes->a2, op, "a_shard");
    int32_t layout = 0;
    std::tie(layout, b_ops) = b_operands(bs, op, "bs");
    for (size_t i = 0; i < b_ops.size(); ++i) {
      b_refs.push_back(b_ref(b_ops[i], layout, op, "bs", static_cast<int64_t>(i)));
      outs.push_back(at::empty({shapes->rows, bs[i].size(1)}, shapes->a2.options()));
      out_refs.push_back(ref(outs.back(), op, "outputs", static_cast<int64_t>(i)));
    }
    if (return_a) {
      a_full = at::empty({shapes->rows, shapes->k}, shapes->a2.options());
      gathered_ref = ref(*a_full, op, "gathered_a");
    }
    opt = options(op, algorithm, chunks_per_rank, layout);
  });
  const asynctp_torch_c_functions& c = c_functions();
  check(c.all_gather_matmul(g.comm, &a_ref, b_refs.data(), static_cast<int>(b_refs.size()), shapes->along_k ? 1 : 0,
                            out_refs.data(), return_a ? &gathered_ref : nullptr, stream, &opt));
  std::vector<at::Tensor> results;
  results.reserve(outs.size());
  for (const at::Tensor& o : outs) results.push_back(shapes->unflatten(o));
  if (a_full) a_full = shapes->unflatten(*a_full);
  return {std::move(a_full), std::move(results)};
}

at::Tensor matmul_reduce_scatter_cuda(const at::Tensor& a, const at::Tensor& b, std::string_view reduce_op,
                                      int64_t scatter_dim, std::string_view group_name, std::string_view algorithm,
                                      int64_t chunks_per_rank) {
  const char* op = "matmul_reduce_scatter";
  const Group g = group(std::string(group_name));
  void* stream = c10::cuda::getCurrentCUDAStream(a.get_device()).stream();
  std::optional<ReduceScatterShapes> shapes;
  asynctp_tensor a_ref{}, b_view{}, out_ref{};
  at::Tensor b_op, out;
  int reduce_code = 0;
  asynctp_op_options opt{};
  unless_refused(g, op, stream, [&] {
    shapes.emplace(a, b, scatter_dim, g.world_size);
    check_device(g, a, op, "a");
    check_device(g, b, op, "b");
    if (reduce_op == "sum") {
      reduce_code = ASYNCTP_SUM;
    } else if (reduce_op == "avg") {
      reduce_code = ASYNCTP_AVG;
    } else {
      refuse(op, ": reduce_op is '", reduce_op, "'; expected 'sum' or 'avg'");
    }
    a_ref = ref(shapes->a2, op, "a");
    auto [layout, b_ops] = b_operands({b}, op, "b");
    b_op = b_ops[0];
    b_view = b_ref(b_op, layout, op, "b", -1);
    out = at::empty(shapes->out_shape, shapes->a2.options());
    out_ref = ref(out, op, "output");
    opt = options(op, algorithm, chunks_per_rank, layout);
  });
  check(c_functions().matmul_reduce_scatter(g.comm, &a_ref, &b_view, shapes->along_n ? 1 : 0, reduce_code, &out_ref,
                                            stream, &opt));
  return shapes->unflatten(out);
}

}  // namespace asynctp::torch_ext

TORCH_LIBRARY_FRAGMENT(asynctp, m) {
  m.def("all_gather_matmul(Tensor a_shard, Tensor[] bs, int gather_dim, str group_name, bool return_a, "
        "str algorithm, int chunks_per_rank) -> (Tensor?, Tensor[])");
  m.def("matmul_reduce_scatter(Tensor a, Tensor b, str reduce_op, int scatter_dim, str group_name, "
        "str algorithm, int chunks_per_rank) -> Tensor");
}

TORCH_LIBRARY_IMPL(asynctp, CUDA, m) {
  m.impl("all_gather_matmul", &asynctp::torch_ext::all_gather_matmul_cuda);
  m.impl("matmul_reduce_scatter", &asynctp::torch_ext::matmul_reduce_scatter_cuda);
}
