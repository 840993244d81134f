#include "comm/in_process_group.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>

#include "common/check.h"

namespace asynctp {

std::shared_ptr<InProcessGroup> InProcessGroup::create(int world_size, const InProcessOptions& options) {
  ASYNCTP_CHECK(world_size >= 1, "InProcessGroup::create: world_size must be >= 1, got ", world_size);
  auto impl = std::make_unique<Impl>();
  impl->world_size = world_size;
  impl->devices = options.devices;
  if (impl->devices.empty()) {
    int count = 0;
    ASYNCTP_CUDA_CHECK(cudaGetDeviceCount(&count));
    for (int d = 0; d < count; ++d) impl->devices.push_back(d);
  }
  ASYNCTP_CHECK(!impl->devices.empty(), "InProcessGroup::create: no CUDA device to run the ranks on");
  int count = 0;
  ASYNCTP_CUDA_CHECK(cudaGetDeviceCount(&count));
  for (int d : impl->devices) {
    ASYNCTP_CHECK(d >= 0 && d < count, "InProcessGroup::create: options.devices holds ", d, " but this process sees ",
                  count, " GPU(s)");
  }
  return std::shared_ptr<InProcessGroup>(new InProcessGroup(std::move(impl)));
}

InProcessGroup::InProcessGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
InProcessGroup::~InProcessGroup() = default;

int InProcessGroup::world_size() const { return impl_->world_size; }

int InProcessGroup::device_of(int rank) const {
  ASYNCTP_CHECK(rank >= 0 && rank < impl_->world_size, "InProcessGroup::device_of: rank must be in [0, ",
                impl_->world_size, "), got ", rank);
  return impl_->devices[static_cast<size_t>(rank) % impl_->devices.size()];
}

int InProcessGroup::ranks_on_device(int device) const {
  int n = 0;
  for (int r = 0; r < impl_->world_size; ++r) n += device_of(r) == device ? 1 : 0;
  return n;
}

void InProcessGroup::abort(const std::string& why) { impl_->abort(why); }
std::string InProcessGroup::aborted() const { return impl_->aborted(); }

void InProcessGroup::Impl::abort(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_.empty()) aborted_ = why.empty() ? std::string("aborted") : why;
  }
  changed_.notify_all();
}

std::string InProcessGroup::Impl::aborted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return aborted_;
}

std::vector<std::string> InProcessGroup::Impl::exchange(int rank, const std::string& mine, int timeout_ms,
                                                        const char* what) {
  std::unique_lock<std::mutex> lock(mu_);
  if (rounds_.empty()) rounds_.assign(static_cast<size_t>(world_size), 0);
  if (!aborted_.empty()) detail::raise(detail::cat(what, ": the in-process group was aborted: ", aborted_));
  const uint64_t round = ++rounds_[static_cast<size_t>(rank)];
  const int b = static_cast<int>(round & 1);
  if (round_of_[b] != round) {
    round_of_[b] = round;
    published_[b] = 0;
    parts_[b].assign(static_cast<size_t>(world_size), std::string());
  }
  parts_[b][static_cast<size_t>(rank)] = mine;
  if (++published_[b] == static_cast<uint64_t>(world_size)) changed_.notify_all();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  const bool complete = changed_.wait_until(lock, deadline, [&] {
    return !aborted_.empty() || (round_of_[b] == round && published_[b] == static_cast<uint64_t>(world_size));
  });
  if (!aborted_.empty()) detail::raise(detail::cat(what, ": the in-process group was aborted: ", aborted_));
  if (!complete) {
    std::string missing;
    for (int r = 0; r < world_size; ++r) {
      if (rounds_[static_cast<size_t>(r)] < round) missing += detail::cat(missing.empty() ? "" : ", ", r);
    }
    const std::string why = detail::cat(what, ": rank(s) ", missing, " did not reach exchange ", round, " within ",
                                        timeout_ms, " ms (ASYNCTP_TIMEOUT_MS sets the bound)");
    if (aborted_.empty()) aborted_ = detail::with_rank(why);
    lock.unlock();
    changed_.notify_all();
    detail::raise(why);
  }
  return parts_[b];
}

}  // namespace asynctp
