// launch() with LaunchOptions::in_process: one child process whose threads are the ranks of an
// in-process group (docs/design/transport.md).
#include <cuda_runtime_api.h>

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>

#include "asynctp/in_process.h"
#include "comm/in_process_group.h"
#include "comm/launch_job.h"

namespace asynctp::detail {
namespace {

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
      auto still_running = [&] {  // "0, 2": the ranks that have not returned (under out->mu)
        std::string ranks;
        for (int r = 0; r < world_size; ++r) {
          if (out->codes[static_cast<size_t>(r)] < 0) ranks += detail::cat(ranks.empty() ? "" : ", ", r);
        }
        return ranks;
      };
      const std::string hung = still_running();
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
      std::string still = still_running();
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
  // The report goes first and no thread is joined: a rank's thread that has returned can still hang in
  // its exit (CUDA's per-thread teardown, after a kernel of its context trapped), and the process
  // ends right after the report anyway (run_child's _exit), taking every thread with it.
  process.allgather(line);
  std::fflush(stdout);
  std::fflush(stderr);
  for (std::thread& t : threads) t.detach();
  if (!all_returned) _exit(1);
  return line.find(";-1;") != std::string::npos ? 0 : 1;
}

}  // namespace

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
}  // namespace asynctp::detail
