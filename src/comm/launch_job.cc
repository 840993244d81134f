// The process launcher's wire format and each forked rank's life (launch_job.h).
#include "comm/launch_job.h"

#include <sys/prctl.h>

#include <cstdio>
#include <cstring>

namespace asynctp::detail {
namespace {

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

}  // namespace

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

}  // namespace asynctp::detail
