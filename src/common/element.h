// Internal: the element types and matrix layouts the kernels take, and how asynctp's public DType and
// BLayout map onto them. The kernels name only these, so that device code includes no public header.
#pragma once

#include "asynctp/tensor.h"

namespace asynctp {

enum class Element { kBF16, kFP16, kFP8E4M3 };
// How a matrix is stored: kRowMajor [rows, cols] with cols contiguous, kColMajor the transpose.
enum class Layout { kRowMajor, kColMajor };

// The kernels' element for `dtype`; only bf16, fp16 and fp8 e4m3 have one (the plan refuses the rest
// first).
inline Element element_of(DType dtype) {
  return dtype == DType::kFP16 ? Element::kFP16 : dtype == DType::kFP8E4M3 ? Element::kFP8E4M3 : Element::kBF16;
}
// B's layout as the kernels store it: [K, N] row-major, or [N, K] (nn.Linear's weight) column-major.
inline Layout layout_of(BLayout b_layout) { return b_layout == BLayout::kColMajor ? Layout::kColMajor : Layout::kRowMajor; }
inline const char* element_name(Element e) {
  return e == Element::kFP16 ? "fp16" : e == Element::kFP8E4M3 ? "fp8 e4m3" : "bf16";
}

}  // namespace asynctp
