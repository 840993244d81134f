// Internal: byte arithmetic on the raw pointers the algorithms hand to CUDA copies and GEMMs.
#pragma once

#include <cstddef>

namespace asynctp::algo {

// `p` as a byte pointer, for offsets (the algorithms write only through the caller's outputs).
inline char* bytes(const void* p) { return static_cast<char*>(const_cast<void*>(p)); }

// `n` rounded up to 256 bytes, the alignment every slice of scratch and workspace starts at.
inline size_t align_up(size_t n) { return (n + 255) / 256 * 256; }

}  // namespace asynctp::algo
