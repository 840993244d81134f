// Internal: NCCL's blocking set-up calls (making a communicator, splitting one, registering a
// window), which wait for every peer with no bound of their own, run with one.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>

#include "asynctp/error.h"
#include "common/check.h"

namespace asynctp::comm {

// Thrown where such a call has not returned within its bound. NCCL is then in a state nothing can
// safely touch (an abort could block as well), so nothing of it is freed: the process should end.
class SetupStuck : public Error {
 public:
  using Error::Error;
};

// The bound of the set-up calls: the communicator's timeout, but at least kSetupFloorMs, as making an
// NCCL communicator takes seconds on a machine that has not made one yet.
constexpr int kSetupFloorMs = 10000;
inline int setup_bound_ms(int timeout_ms) { return timeout_ms > kSetupFloorMs ? timeout_ms : kSetupFloorMs; }

// Runs fn() on a thread of its own (on `device`, errors naming `rank`) and returns what it returned,
// or rethrows what it threw. Where it has not returned within bound_ms, throws SetupStuck naming
// `what`, and the thread is left to it: fn must take everything it uses by value.
template <typename R>
R within_bound(int device, int rank, int bound_ms, const char* what, std::function<R()> fn) {
  auto result = std::make_shared<std::promise<R>>();
  std::future<R> done = result->get_future();
  std::thread([device, rank, fn = std::move(fn), result] {
    try {
      const detail::RankScope scope(rank);
      ASYNCTP_CUDA_CHECK(cudaSetDevice(device));
      result->set_value(fn());
    } catch (...) {
      result->set_exception(std::current_exception());
    }
  }).detach();
  if (done.wait_for(std::chrono::milliseconds(bound_ms)) != std::future_status::ready) {
    throw SetupStuck(detail::with_rank(detail::cat(
        what, " did not return within ", bound_ms, " ms: a peer did not take part (it failed, was not started, ",
        "or was given another NCCL id; the bound is the communicator's timeout, at least ", kSetupFloorMs,
        " ms). NCCL's state is unknown, so nothing of it is freed: end this process")));
  }
  return done.get();
}

}  // namespace asynctp::comm
