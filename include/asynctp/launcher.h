// Runs N ranks on one node: one process per GPU, or (LaunchOptions::in_process) N threads of one
// process on however many GPUs there are, for running multi-rank code on fewer GPUs than ranks.
//
// The launcher forks before any CUDA call (CUDA cannot be used in a child forked after its parent
// touched CUDA), so the process that calls launch() must not have used CUDA yet. Each rank gets its
// rank, the world size, its GPU and an ncclUniqueId (or, in-process, its group), and can exchange bytes
// with the other ranks (allgather()) or line up with them on shared memory (barrier()). The launcher
// itself never calls CUDA or NCCL.
//
// A rank that exits non-zero (in-process: returns non-zero or throws), dies of a signal, leaves an
// exchange the others wait on, or outlives the timeout makes the launcher stop the others and report
// which rank failed and how. launch() always returns; it never hangs.
#pragma once

#include <nccl.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace asynctp {

class InProcessGroup;

class RankContext {
 public:
  int rank = 0;
  int world_size = 1;
  int device = 0;           // the GPU this rank should use (CUDA ordinal)
  ncclUniqueId nccl_id{};   // the same on every rank (made by rank 0) when LaunchOptions::make_nccl_id
  // The in-process group the rank is a thread of (LaunchOptions::in_process); null for a process.
  // Communicator::create(ctx) makes the rank's communicator either way.
  std::shared_ptr<InProcessGroup> group;

  // Collective: every rank calls it the same number of times. Returns every rank's `mine`, by rank.
  // Throws asynctp::Error if the launcher is gone.
  std::vector<std::string> allgather(const std::string& mine) const;

  // Collective: returns once every rank has called it as often as this one. It spins on memory the
  // ranks share, so every rank leaves it within about a microsecond of the others with its thread
  // running, where allgather() wakes each rank from a socket read, in turn and on a core that may
  // have gone to sleep. For lining ranks up before a timed call. A rank that does not arrive within
  // `timeout_ms` (<= 0: ASYNCTP_TIMEOUT_MS, else 30 s) makes it throw asynctp::Error naming that rank.
  void barrier(int timeout_ms = 0) const;

  int up_fd = -1;    // to the launcher
  int down_fd = -1;  // from the launcher
  std::shared_ptr<InProcessGroup> exchanges;  // in-process: what allgather() goes through (not `group`,
                                              // whose failures must not end the launcher's exchanges)
  void* barrier_words = nullptr;  // shared by the ranks: each rank's count of barrier() calls entered
};

// The function each rank runs in its own process (or thread). Its return value is the process's exit
// code; an exception escaping it is printed ("rank R: ...") and counts as code 1.
using RankMain = std::function<int(RankContext&)>;

struct LaunchOptions {
  // The whole job is stopped after this long. <= 0 means the default: ASYNCTP_LAUNCH_TIMEOUT_MS
  // from the environment, else 10 minutes.
  int timeout_ms = 0;
  // Rank r gets GPU first_device + r.
  int first_device = 0;
  // Rank 0 makes an ncclUniqueId and the launcher hands it to every rank before RankMain runs.
  bool make_nccl_id = true;
  // How long stopped ranks get between SIGTERM and SIGKILL.
  int kill_grace_ms = 2000;
  // Run the ranks as threads of one child process, an InProcessGroup spread over the GPUs from
  // first_device on (rank r on the (r mod G)-th), instead of one process per GPU. A rank that fails
  // aborts the group, so that the others' waits end; one that has not returned by the timeout is
  // named, and the process ends. For tests and development on fewer GPUs than ranks; a rank cannot
  // die alone (a fault that kills a process ends every rank).
  bool in_process = false;
};

struct RankOutcome {
  enum class State { kExited, kSignaled, kTimedOut, kStoppedByLauncher, kNotStarted };
  State state = State::kNotStarted;
  int exit_code = 0;  // for kExited
  int signal = 0;     // for kSignaled, kTimedOut and kStoppedByLauncher: the signal that ended it
  std::string describe() const;
};

struct LaunchResult {
  bool ok = false;               // every rank exited with code 0
  int failed_rank = -1;          // the first rank seen failing, or -1
  std::string message;           // one line: what failed, where and how; "all N ranks exited 0" if ok
  std::vector<RankOutcome> ranks;  // in-process: each rank's code; a process-level failure marks them all
};

LaunchResult launch(int world_size, const RankMain& main, const LaunchOptions& options = {});

// The number of CUDA devices this process would see, found in a forked child so that the caller
// stays free of CUDA and can still launch(). 0 where there is no usable GPU; `reason` then says why.
int probe_cuda_device_count(std::string* reason = nullptr);

}  // namespace asynctp
