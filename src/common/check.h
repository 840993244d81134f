// Internal: how asynctp raises errors and checks the return codes of CUDA, the driver, NCCL and
// cuBLASLt. Every failure becomes an asynctp::Error whose message starts with this process's rank.
#pragma once

#include <sstream>
#include <string>
#include <utility>

#include "asynctp/error.h"

namespace asynctp::detail {

// The rank this process (or, for the ranks of an in-process group, this thread) plays, set when its
// Communicator is made; -1 before that.
void set_process_rank(int rank);
int process_rank();

// "rank R: " + message (or just message before a rank is known).
std::string with_rank(const std::string& message);

[[noreturn]] void raise(const std::string& message);

template <typename... Args>
std::string cat(Args&&... args) {
  std::ostringstream s;
  (s << ... << std::forward<Args>(args));
  return s.str();
}

[[noreturn]] void raise_cuda(int code, const char* expr, const char* file, int line);
[[noreturn]] void raise_driver(int code, const char* expr, const char* file, int line);
[[noreturn]] void raise_nccl(int code, const char* expr, const char* file, int line);
[[noreturn]] void raise_cublas(int code, const char* expr, const char* file, int line);

}  // namespace asynctp::detail

#define ASYNCTP_CHECK(cond, ...)                                                        \
  do {                                                                                  \
    if (!(cond)) ::asynctp::detail::raise(::asynctp::detail::cat(__VA_ARGS__));        \
  } while (0)

#define ASYNCTP_CUDA_CHECK(expr)                                                               \
  do {                                                                                         \
    const auto asynctp_err_ = (expr);                                                          \
    if (asynctp_err_ != 0) ::asynctp::detail::raise_cuda(asynctp_err_, #expr, __FILE__, __LINE__); \
  } while (0)

#define ASYNCTP_CU_CHECK(expr)                                                                       \
  do {                                                                                               \
    const auto asynctp_err_ = (expr);                                                                \
    if (asynctp_err_ != 0) ::asynctp::detail::raise_driver(asynctp_err_, #expr, __FILE__, __LINE__); \
  } while (0)

#define ASYNCTP_NCCL_CHECK(expr)                                                                   \
  do {                                                                                             \
    const auto asynctp_err_ = (expr);                                                              \
    if (asynctp_err_ != 0) ::asynctp::detail::raise_nccl(asynctp_err_, #expr, __FILE__, __LINE__); \
  } while (0)

#define ASYNCTP_CUBLAS_CHECK(expr)                                                                   \
  do {                                                                                               \
    const auto asynctp_err_ = (expr);                                                                \
    if (asynctp_err_ != 0) ::asynctp::detail::raise_cublas(asynctp_err_, #expr, __FILE__, __LINE__); \
  } while (0)
