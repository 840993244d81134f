// Internal: how asynctp raises errors and checks the return codes of CUDA, the driver, NCCL and
// cuBLASLt. Every failure becomes an asynctp::Error whose message starts with the calling rank.
#pragma once

#include <sstream>
#include <string>
#include <utility>

#include "asynctp/error.h"

namespace asynctp::detail {

// The rank an error names: inside a call on a communicator, that communicator's (RankScope); else the
// rank of the last communicator made on this thread (set_thread_rank, once it is made); else none.
// Per thread, not per process: the ranks of an in-process group are threads of one process, and one
// process may hold communicators of different ranks.
void set_thread_rank(int rank);
int current_rank();

// Opened by every public entry that takes a communicator, for the length of the call.
class RankScope {
 public:
  explicit RankScope(int rank);
  ~RankScope();
  RankScope(const RankScope&) = delete;
  RankScope& operator=(const RankScope&) = delete;

 private:
  int outer_;
};

// "rank R: " + message (or just message where no rank is known).
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
