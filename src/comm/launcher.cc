// The rank launcher's public side: launch(), RankContext's exchange and barrier (include/asynctp/launcher.h).
// The fork-based job is in launch_job.h, the in-process mode in in_process_launch.cc.
#include "asynctp/launcher.h"

#include <cstring>
#include <string>
#include <vector>

#include "comm/in_process_group.h"
#include "comm/launch_job.h"
#include "common/check.h"

namespace asynctp {

using detail::BarrierWord;
using detail::Clock;
using detail::Job;
using detail::launch_in_process;
using detail::recv_framed;
using detail::send_framed;
using detail::signal_name;

std::vector<std::string> RankContext::allgather(const std::string& mine) const {
  if (exchanges) return impl_of(*exchanges).exchange(rank, mine, detail::resolve_timeout_ms(0), "RankContext::allgather");
  if (!send_framed(up_fd, mine)) {
    throw Error(detail::cat("rank ", rank, ": the launcher is gone (exchange send failed)"));
  }
  const auto all = recv_framed(down_fd);
  if (!all) throw Error(detail::cat("rank ", rank, ": the launcher is gone (exchange receive failed)"));
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos + sizeof(uint32_t) <= all->size()) {
    uint32_t n;
    std::memcpy(&n, all->data() + pos, sizeof n);
    pos += sizeof n;
    out.push_back(all->substr(pos, n));
    pos += n;
  }
  if (static_cast<int>(out.size()) != world_size) {
    throw Error(detail::cat("rank ", rank, ": exchange returned ", out.size(), " parts, expected ", world_size));
  }
  return out;
}

void RankContext::barrier(int timeout_ms) const {
  ASYNCTP_CHECK(barrier_words != nullptr, "rank ", rank, ": barrier() needs a RankContext made by launch()");
  BarrierWord* words = static_cast<BarrierWord*>(barrier_words);
  const uint64_t round = words[rank].entered.load(std::memory_order_relaxed) + 1;
  words[rank].entered.store(round, std::memory_order_release);
  const int bound_ms = detail::resolve_timeout_ms(timeout_ms);
  const auto deadline = Clock::now() + std::chrono::milliseconds(bound_ms);
  for (int r = 0; r < world_size; ++r) {
    // Spins without yielding: a yield or a sleep is what would set the ranks microseconds apart.
    for (uint32_t spin = 1; words[r].entered.load(std::memory_order_acquire) < round; ++spin) {
      if ((spin & 0xFFFF) == 0 && Clock::now() > deadline) {
        throw Error(detail::cat("rank ", rank, ": barrier ", round, ": rank ", r, " did not arrive within ", bound_ms,
                                " ms (ASYNCTP_TIMEOUT_MS sets the bound)"));
      }
    }
  }
}

std::string RankOutcome::describe() const {
  switch (state) {
    case State::kExited:
      return detail::cat("exited with code ", exit_code);
    case State::kSignaled:
      return detail::cat("was killed by ", signal_name(signal), " (", strsignal(signal), ")");
    case State::kTimedOut:
      return detail::cat("timed out and was stopped with ", signal_name(signal));
    case State::kStoppedByLauncher:
      return detail::cat("was stopped by the launcher with ", signal_name(signal), " after another rank failed");
    case State::kNotStarted:
      break;
  }
  return "was not started";
}

LaunchResult launch(int world_size, const RankMain& main, const LaunchOptions& options) {
  ASYNCTP_CHECK(world_size >= 1, "launch: world_size must be >= 1, got ", world_size);
  ASYNCTP_CHECK(static_cast<bool>(main), "launch: main must be a callable, got an empty function");
  ASYNCTP_CHECK(options.first_device >= 0, "launch: options.first_device must be >= 0, got ", options.first_device);
  ASYNCTP_CHECK(options.kill_grace_ms >= 0, "launch: options.kill_grace_ms must be >= 0, got ", options.kill_grace_ms);
  if (options.in_process) return launch_in_process(world_size, main, options);
  return Job(world_size, options).run(main);
}

}  // namespace asynctp
