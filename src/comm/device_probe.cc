// probe_cuda_device_count: asks CUDA in a throw-away child, so the caller stays free of CUDA and can
// still fork ranks afterwards.
#include <cuda_runtime_api.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "asynctp/launcher.h"

namespace asynctp {

int probe_cuda_device_count(std::string* reason) {
  int fds[2];
  if (::pipe(fds) != 0) {
    if (reason) *reason = std::string("pipe: ") + std::strerror(errno);
    return 0;
  }
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    std::string msg = err == cudaSuccess ? std::string() : std::string(cudaGetErrorString(err));
    if (err != cudaSuccess) count = 0;
    (void)!::write(fds[1], &count, sizeof count);
    (void)!::write(fds[1], msg.data(), msg.size());
    _exit(0);
  }
  ::close(fds[1]);
  int count = 0;
  std::string msg;
  if (pid < 0 || ::read(fds[0], &count, sizeof count) != static_cast<ssize_t>(sizeof count)) {
    count = 0;
    msg = "the CUDA probe process failed";
  } else {
    char buf[256];
    ssize_t k;
    while ((k = ::read(fds[0], buf, sizeof buf)) > 0) msg.append(buf, static_cast<size_t>(k));
  }
  ::close(fds[0]);
  if (pid > 0) ::waitpid(pid, nullptr, 0);
  if (reason) *reason = count > 0 ? std::string() : (msg.empty() ? "no CUDA device found" : msg);
  return count;
}

}  // namespace asynctp
