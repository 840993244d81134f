// Internal: the process launcher's job (fork one child per rank, relay their exchanges, watch them,
// stop them all when one fails or the time is up) and the wire format between parent and children.
// No CUDA and no NCCL calls in the parent. Used by launch() (launcher.cc) and by the in-process mode
// (in_process_launch.cc), whose one child is a job of one rank.
#pragma once

#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "asynctp/launcher.h"
#include "common/check.h"
#include "common/env.h"

namespace asynctp::detail {

using Clock = std::chrono::steady_clock;

// Wire format, both directions: u32 byte count, then the bytes. Upward a message is one rank's
// contribution; downward it is the world_size contributions, each framed the same way.
bool send_framed(int fd, const std::string& bytes);
std::optional<std::string> recv_framed(int fd);

// barrier(): one counter per rank, each on a cache line of its own so that a rank's store does not
// take the line its peers are reading.
struct alignas(64) BarrierWord {
  std::atomic<uint64_t> entered{0};
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "barrier() needs lock-free atomics in shared memory");

struct Child {
  pid_t pid = -1;
  int fd = -1;            // parent's end of the socket pair
  bool running = false;
  std::string inbox;      // bytes received, not yet parsed
  std::optional<std::string> contribution;  // this round's, once complete
  RankOutcome outcome;
};

// A forked rank's life: runs `main` and exits with its code, never returning.
[[noreturn]] void run_child(int rank, int world_size, int fd, void* barrier_words, const RankMain& main,
                            const LaunchOptions& options);

// "SIGKILL" for SIGKILL.
std::string signal_name(int sig);

class Job {
 public:
  Job(int world_size, const LaunchOptions& options) : children_(world_size), options_(options) {}
  ~Job() {
    if (barrier_words_ != MAP_FAILED) ::munmap(barrier_words_, barrier_bytes());
  }

  LaunchResult run(const RankMain& main) {
    const int timeout_ms = options_.timeout_ms > 0
                               ? options_.timeout_ms
                               : detail::knob_int(detail::Knob::kLaunchTimeoutMs, detail::kDefaultLaunchTimeoutMs);
    if (!start(main)) return finish();
    const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    while (running_count() > 0 && result_.failed_rank < 0) {
      poll_messages(20);
      reap(false);
      check_stalled_exchange();
      if (result_.failed_rank < 0 && Clock::now() > deadline) {
        time_out(timeout_ms);
      }
    }
    stop_all();
    return finish();
  }

 // Every rank's part of the last exchange the launcher relayed.
  const std::vector<std::string>& last_exchange() const { return last_exchange_; }

 private:
  bool start(const RankMain& main) {
    // Mapped before the fork, so every child shares it.
    barrier_words_ = ::mmap(nullptr, barrier_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (barrier_words_ == MAP_FAILED) {
      fail(0, detail::cat("could not start the ranks: mmap of ", barrier_bytes(), " shared bytes: ", std::strerror(errno)));
      return false;
    }
    new (barrier_words_) BarrierWord[size()];
    std::fflush(stdout);
    std::fflush(stderr);
    for (int r = 0; r < size(); ++r) {
      int fds[2];
      if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
        fail(r, detail::cat("could not start rank ", r, ": socketpair: ", std::strerror(errno)));
        return false;
      }
      const pid_t pid = ::fork();
      if (pid < 0) {
        ::close(fds[0]);
        ::close(fds[1]);
        fail(r, detail::cat("could not start rank ", r, ": fork: ", std::strerror(errno)));
        return false;
      }
      if (pid == 0) {
        ::close(fds[0]);
        for (int q = 0; q < r; ++q) ::close(children_[q].fd);
        run_child(r, size(), fds[1], barrier_words_, main, options_);
      }
      ::close(fds[1]);
      children_[r].pid = pid;
      children_[r].fd = fds[0];
      children_[r].running = true;
    }
    return true;
  }

  int size() const { return static_cast<int>(children_.size()); }
  size_t barrier_bytes() const { return sizeof(BarrierWord) * children_.size(); }

  int running_count() const {
    int n = 0;
    for (const Child& c : children_) n += c.running ? 1 : 0;
    return n;
  }

  void poll_messages(int wait_ms) {
    std::vector<pollfd> fds;
    std::vector<int> ranks;
    for (int r = 0; r < size(); ++r) {
      if (children_[r].fd >= 0) {
        fds.push_back({children_[r].fd, POLLIN, 0});
        ranks.push_back(r);
      }
    }
    if (fds.empty()) {
      ::usleep(wait_ms * 1000);
      return;
    }
    if (::poll(fds.data(), fds.size(), wait_ms) <= 0) return;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      Child& c = children_[ranks[i]];
      char buf[65536];
      const ssize_t k = ::recv(c.fd, buf, sizeof buf, MSG_DONTWAIT);
      if (k > 0) {
        c.inbox.append(buf, static_cast<size_t>(k));
        parse(ranks[i]);
      } else if (k == 0 || (errno != EINTR && errno != EAGAIN)) {
        ::close(c.fd);  // the child closed its end: it is exiting; reap() records how
        c.fd = -1;
      }
    }
    deliver_if_complete();
  }

  void parse(int rank) {
    Child& c = children_[rank];
    while (c.inbox.size() >= sizeof(uint32_t)) {
      uint32_t n;
      std::memcpy(&n, c.inbox.data(), sizeof n);
      if (c.inbox.size() < sizeof n + n) return;
      if (c.contribution) {
        fail(rank, detail::cat("rank ", rank, " sent a second exchange message before the others sent their first"));
        return;
      }
      c.contribution = c.inbox.substr(sizeof n, n);
      c.inbox.erase(0, sizeof n + n);
    }
  }

  void deliver_if_complete() {
    for (const Child& c : children_) {
      if (!c.contribution) return;
    }
    std::string all;
    for (Child& c : children_) {
      const uint32_t n = static_cast<uint32_t>(c.contribution->size());
      all.append(reinterpret_cast<const char*>(&n), sizeof n);
      all.append(*c.contribution);
    }
    last_exchange_.clear();
    for (Child& c : children_) last_exchange_.push_back(*c.contribution);
    for (Child& c : children_) c.contribution.reset();
    for (Child& c : children_) {
      if (c.fd >= 0) send_framed(c.fd, all);  // a rank that died meanwhile is reported by reap()
    }
  }

  // A rank that has exited can never contribute: ranks waiting on the exchange would wait forever.
  void check_stalled_exchange() {
    if (result_.failed_rank >= 0) return;
    bool pending = false;
    for (const Child& c : children_) pending = pending || c.contribution.has_value();
    if (!pending) return;
    for (int r = 0; r < size(); ++r) {
      const Child& c = children_[r];
      if (!c.running && !c.contribution) {
        fail(r, detail::cat("rank ", r, " ", c.outcome.describe(),
                            " while other ranks waited for it in an exchange"));
        return;
      }
    }
  }

  // Collects exited children; blocking waits for all of them when `block`.
  void reap(bool block) {
    for (int r = 0; r < size(); ++r) {
      Child& c = children_[r];
      if (!c.running) continue;
      int status = 0;
      pid_t got;
      do {
        got = ::waitpid(c.pid, &status, block ? 0 : WNOHANG);
      } while (got < 0 && errno == EINTR);
      if (got != c.pid) continue;
      c.running = false;
      if (c.outcome.state == RankOutcome::State::kTimedOut ||
          c.outcome.state == RankOutcome::State::kStoppedByLauncher) {
        if (WIFSIGNALED(status)) c.outcome.signal = WTERMSIG(status);
        if (WIFEXITED(status)) c.outcome.exit_code = WEXITSTATUS(status);
        continue;
      }
      if (WIFEXITED(status)) {
        c.outcome.state = RankOutcome::State::kExited;
        c.outcome.exit_code = WEXITSTATUS(status);
      } else if (WIFSIGNALED(status)) {
        c.outcome.state = RankOutcome::State::kSignaled;
        c.outcome.signal = WTERMSIG(status);
      }
      const bool failed = c.outcome.state != RankOutcome::State::kExited || c.outcome.exit_code != 0;
      if (failed && result_.failed_rank < 0) fail(r, detail::cat("rank ", r, " ", c.outcome.describe()));
    }
  }

  void time_out(int timeout_ms) {
    int first = -1;
    for (int r = 0; r < size(); ++r) {
      if (children_[r].running) {
        children_[r].outcome.state = RankOutcome::State::kTimedOut;
        if (first < 0) first = r;
      }
    }
    std::string who;
    for (int r = 0; r < size(); ++r) {
      if (children_[r].outcome.state == RankOutcome::State::kTimedOut) who += detail::cat(who.empty() ? "" : ", ", r);
    }
    fail(first, detail::cat("timed out after ", timeout_ms, " ms: rank(s) ", who,
                            " still running (ASYNCTP_LAUNCH_TIMEOUT_MS or LaunchOptions::timeout_ms sets the bound)"));
  }

  void fail(int rank, const std::string& message) {
    if (result_.failed_rank >= 0) return;
    result_.failed_rank = rank;
    result_.message = message;
  }

  // SIGTERM to every rank still running, SIGKILL to those still there after the grace period.
  void stop_all() {
    for (Child& c : children_) {
      if (!c.running) continue;
      if (c.outcome.state == RankOutcome::State::kNotStarted) c.outcome.state = RankOutcome::State::kStoppedByLauncher;
      ::kill(c.pid, SIGTERM);
    }
    const auto grace_end = Clock::now() + std::chrono::milliseconds(options_.kill_grace_ms);
    while (running_count() > 0 && Clock::now() < grace_end) {
      reap(false);
      if (running_count() > 0) ::usleep(10000);
    }
    for (Child& c : children_) {
      if (c.running) ::kill(c.pid, SIGKILL);
    }
    reap(true);
    for (Child& c : children_) {
      if (c.fd >= 0) ::close(c.fd);
      c.fd = -1;
    }
  }

  LaunchResult finish() {
    stop_all();
    result_.ok = result_.failed_rank < 0;
    if (result_.ok) {
      result_.message = detail::cat("all ", size(), " ranks exited 0");
    } else {
      std::string stopped;
      for (int r = 0; r < size(); ++r) {
        if (children_[r].outcome.state == RankOutcome::State::kStoppedByLauncher) {
          stopped += detail::cat(stopped.empty() ? "" : ", ", r);
        }
      }
      if (!stopped.empty()) result_.message += detail::cat("; the launcher stopped rank(s) ", stopped);
    }
    for (Child& c : children_) result_.ranks.push_back(c.outcome);
    return result_;
  }

  std::vector<Child> children_;
  std::vector<std::string> last_exchange_;
  LaunchOptions options_;
  LaunchResult result_;
  void* barrier_words_ = MAP_FAILED;
};

// launch() with LaunchOptions::in_process (in_process_launch.cc).
LaunchResult launch_in_process(int world_size, const RankMain& main, const LaunchOptions& options);

}  // namespace asynctp::detail
