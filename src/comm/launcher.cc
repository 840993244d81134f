// The rank launcher: fork one child per rank, relay their exchanges, watch them, stop them all when one
// fails or the time is up. See include/asynctp/launcher.h. No CUDA and no NCCL calls in the parent.
#include "asynctp/launcher.h"

#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <thread>

#include "asynctp/in_process.h"
#include "comm/in_process_group.h"
#include "common/check.h"
#include "common/env.h"

namespace asynctp {
namespace {

using Clock = std::chrono::steady_clock;

// Wire format, both directions: u32 byte count, then the bytes. Upward a message is one rank's
// contribution; downward it is the world_size contributions, each framed the same way.
bool send_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

bool recv_all(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t k = ::recv(fd, p, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

bool send_framed(int fd, const std::string& bytes) {
  const uint32_t n = static_cast<uint32_t>(bytes.size());
  return send_all(fd, &n, sizeof n) && send_all(fd, bytes.data(), bytes.size());
}

std::optional<std::string> recv_framed(int fd) {
  uint32_t n = 0;
  if (!recv_all(fd, &n, sizeof n)) return std::nullopt;
  std::string bytes(n, '\0');
  if (n > 0 && !recv_all(fd, bytes.data(), n)) return std::nullopt;
  return bytes;
}

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

[[noreturn]] void run_child(int rank, int world_size, int fd, void* barrier_words, const RankMain& main,
                            const LaunchOptions& options) {
  // Die with the launcher: a rank must never outlive the job that started it.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  int code = 1;
  try {
    RankContext ctx;
    ctx.rank = rank;
    ctx.world_size = world_size;
    ctx.device = options.first_device + rank;
    ctx.up_fd = ctx.down_fd = fd;
    ctx.barrier_words = barrier_words;
    if (options.make_nccl_id) {
      std::string mine;
      if (rank == 0) {
        ncclUniqueId id;
        const ncclResult_t res = ncclGetUniqueId(&id);
        if (res != ncclSuccess) throw Error(detail::cat("ncclGetUniqueId failed: ", ncclGetErrorString(res)));
        mine.assign(reinterpret_cast<const char*>(&id), sizeof id);
      }
      const auto all = ctx.allgather(mine);
      if (all[0].size() != sizeof(ncclUniqueId)) throw Error("rank 0 sent no ncclUniqueId");
      std::memcpy(&ctx.nccl_id, all[0].data(), sizeof(ncclUniqueId));
    }
    code = main(ctx);
  } catch (const std::exception& e) {
    const std::string what = e.what();
    // Library errors already carry their rank.
    std::fprintf(stderr, "%s%s\n", what.rfind("rank ", 0) == 0 ? "" : detail::cat("rank ", rank, ": ").c_str(),
                 what.c_str());
    code = 1;
  } catch (...) {
    std::fprintf(stderr, "rank %d: unknown exception\n", rank);
    code = 1;
  }
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(code);
}

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? detail::cat("SIG", abbrev) : detail::cat("signal ", sig);
}

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

// The in-process mode's child: runs the ranks as threads of this process, each on its group's GPU,
// and hands the parent one line per outcome through `process`'s exchange: each rank's code, then
// what failed first. A rank that fails aborts the group, so that the others' host waits end (their
// kernels' waits end by the communicator's timeout). A rank still running at `deadline_ms` is named,
// and the process ends with it.
int run_threads(RankContext& process, int world_size, const RankMain& main, const LaunchOptions& options,
                int deadline_ms) {
  // Line by line: a rank still running at the deadline ends this process with its buffer unwritten,
  // and its last lines are what says where it stopped. (The launcher flushed stdout before the fork.)
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  // Every kernel is loaded when the context is made: a kernel CUDA loads lazily, at its first launch,
  // can wait for the device to go idle, which it would not while another rank's persistent kernel on
  // the same GPU waits for this rank. (Before this process's first CUDA call; a value set stays.)
  ::setenv("CUDA_MODULE_LOADING", "EAGER", /*overwrite=*/0);
  // A stream that waits on a flag (a stream memory operation) holds the hardware queue it is mapped
  // to, and streams beyond the device's connections share queues: streams of different ranks that
  // share one would wait on each other. The most connections CUDA allows keeps that rare.
  ::setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", /*overwrite=*/0);
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count <= options.first_device) {
    throw Error(detail::cat("in-process ranks: no GPU from ", options.first_device, " on (",
                            e != cudaSuccess ? cudaGetErrorString(e) : "none visible", ")"));
  }
  InProcessOptions group_options;
  for (int d = options.first_device; d < count; ++d) group_options.devices.push_back(d);
  const std::shared_ptr<InProcessGroup> group = InProcessGroup::create(world_size, group_options);
  const std::shared_ptr<InProcessGroup> exchanges = InProcessGroup::create(world_size, group_options);
  auto words = std::make_unique<BarrierWord[]>(static_cast<size_t>(world_size));
  // Ends every rank's host waits, in the ops and in RankContext::allgather alike.
  auto abort_all = [group, exchanges](const std::string& why) {
    group->abort(why);
    exchanges->abort(why);
  };

  struct Outcomes {
    std::mutex mu;
    std::condition_variable done;
    std::vector<int> codes;  // -1 while running
    int finished = 0;
    int first_failed = -1;
    std::string first_error;
    bool past_deadline = false;  // a rank failing from then on failed because its waits were ended
  };
  auto out = std::make_shared<Outcomes>();
  out->codes.assign(static_cast<size_t>(world_size), -1);
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([r, world_size, &main, group, exchanges, abort_all, out,
                          barrier_words = static_cast<void*>(words.get())] {
      RankContext ctx;
      ctx.rank = r;
      ctx.world_size = world_size;
      ctx.device = group->device_of(r);
      ctx.group = group;
      ctx.exchanges = exchanges;
      ctx.barrier_words = barrier_words;
      int code = 1;
      std::string error;
      try {
        code = main(ctx);
        if (code != 0) error = detail::cat("rank ", r, " returned ", code);
      } catch (const std::exception& ex) {
        const std::string what = ex.what();
        error = what.rfind("rank ", 0) == 0 ? what : detail::cat("rank ", r, ": ", what);
      } catch (...) {
        error = detail::cat("rank ", r, ": unknown exception");
      }
      if (code != 0) {
        std::fprintf(stderr, "%s\n", error.c_str());
        std::fflush(stderr);
        abort_all(detail::cat("rank ", r, " failed"));
      }
      std::lock_guard<std::mutex> lock(out->mu);
      out->codes[static_cast<size_t>(r)] = code;
      if (code != 0 && out->first_failed < 0 && !out->past_deadline) {
        out->first_failed = r;
        out->first_error = error;
      }
      ++out->finished;
      out->done.notify_all();
    });
  }
  std::string line;
  {
    std::unique_lock<std::mutex> lock(out->mu);
    const auto deadline = Clock::now() + std::chrono::milliseconds(deadline_ms);
    out->done.wait_until(lock, deadline, [&] { return out->finished == world_size; });
    if (out->finished < world_size) {
      // The others may wait on the ones still running: end their waits, and give them a while.
      std::string hung;
      for (int r = 0; r < world_size; ++r) {
        if (out->codes[static_cast<size_t>(r)] < 0) hung += detail::cat(hung.empty() ? "" : ", ", r);
      }
      const std::string why = detail::cat("rank(s) ", hung, " did not return within ", deadline_ms, " ms");
      // Said at once: should ending the others' waits hang too, the caller still learns how far it got.
      std::fprintf(stderr, "in-process ranks: %s; ending the others' waits\n", why.c_str());
      std::fflush(stderr);
      out->past_deadline = true;
      lock.unlock();
      abort_all(why);
      lock.lock();
      out->done.wait_for(lock, std::chrono::milliseconds(2000), [&] { return out->finished == world_size; });
      // The ranks to name are those that did not return even once the others' waits ended: the ones
      // that returned then were waiting on them.
      std::string still;
      for (int r = 0; r < world_size; ++r) {
        if (out->codes[static_cast<size_t>(r)] < 0) still += detail::cat(still.empty() ? "" : ", ", r);
      }
      if (still.empty()) still = hung;
      if (out->first_failed < 0) {
        out->first_error = detail::cat("rank(s) ", still, " did not return within ", deadline_ms,
                                       " ms (the launch timeout bounds in-process ranks)");
        out->first_failed = std::stoi(still);
      }
    }
    for (int r = 0; r < world_size; ++r) line += detail::cat(r == 0 ? "" : ",", out->codes[static_cast<size_t>(r)]);
    line += detail::cat(";", out->first_failed, ";", out->first_error);
  }
  const bool all_returned = [&] {
    std::lock_guard<std::mutex> lock(out->mu);
    return out->finished == world_size;
  }();
  for (std::thread& t : threads) {
    if (all_returned) {
      t.join();
    } else {
      t.detach();  // the process ends right after the report; a stuck rank cannot be joined
    }
  }
  process.allgather(line);
  std::fflush(stdout);
  std::fflush(stderr);
  if (!all_returned) _exit(1);
  return line.find(";-1;") != std::string::npos ? 0 : 1;
}

// The in-process mode, seen from the caller: one child runs every rank (run_threads), and its report
// becomes the result, rank by rank.
LaunchResult launch_in_process(int world_size, const RankMain& main, const LaunchOptions& options) {
  LaunchOptions one = options;
  one.in_process = false;
  one.make_nccl_id = false;
  const int timeout_ms = options.timeout_ms > 0
                             ? options.timeout_ms
                             : detail::knob_int(detail::Knob::kLaunchTimeoutMs, detail::kDefaultLaunchTimeoutMs);
  one.timeout_ms = timeout_ms;
  // The ranks' own deadline comes first, so that a stuck rank is named before the process is stopped.
  const int deadline_ms = std::max(1, timeout_ms - std::min(timeout_ms / 5, 10000));
  Job job(1, one);
  LaunchResult process = job.run([&](RankContext& ctx) { return run_threads(ctx, world_size, main, options, deadline_ms); });
  LaunchResult result;
  result.ranks.assign(static_cast<size_t>(world_size), process.ranks.empty() ? RankOutcome{} : process.ranks[0]);
  const std::vector<std::string>& report = job.last_exchange();
  if (report.size() != 1) {  // the process ended before it could report
    result.failed_rank = 0;
    result.message = detail::cat("the process of the ", world_size, " in-process ranks ",
                                 process.ranks.empty() ? std::string("did not start") : process.ranks[0].describe(),
                                 " before it reported: ", process.message);
    return result;
  }
  const std::string& line = report[0];
  const size_t a = line.find(';'), b = line.find(';', a + 1);
  size_t pos = 0;
  for (int r = 0; r < world_size; ++r) {
    const size_t end = line.find_first_of(",;", pos);
    RankOutcome o;
    o.state = RankOutcome::State::kExited;
    o.exit_code = std::stoi(line.substr(pos, end - pos));
    if (o.exit_code < 0) o.state = RankOutcome::State::kTimedOut;
    result.ranks[static_cast<size_t>(r)] = o;
    pos = end + 1;
  }
  result.failed_rank = std::stoi(line.substr(a + 1, b - a - 1));
  result.ok = result.failed_rank < 0 && process.ok;
  result.message = result.failed_rank >= 0 ? line.substr(b + 1)
                   : process.ok            ? detail::cat("all ", world_size, " in-process ranks returned 0")
                                           : process.message;
  if (!result.ok && result.failed_rank < 0) result.failed_rank = 0;
  return result;
}

}  // namespace

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
