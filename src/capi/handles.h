// Internal: the C interface's handles and its error handling, shared by its source files. A handle
// this library made and has not destroyed is live; any other is refused by name instead of being read,
// and a live one is not destroyed while another thread's call is using it.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "asynctp/c_api.h"
#include "asynctp/communicator.h"
#include "asynctp/in_process.h"
#include "common/check.h"

struct asynctp_comm {
  std::unique_ptr<asynctp::Communicator> comm;
  std::atomic<int> symmetrics{0};  // live asynctp_symmetric handles on it, which it must outlive
};

struct asynctp_group {
  std::shared_ptr<asynctp::InProcessGroup> group;
};

namespace asynctp::capi {

using detail::cat;
using detail::raise;

// This thread's last failure, which asynctp_last_error returns.
std::string& last_error();

// Runs `fn`: 0, or -1 with the exception's message kept for asynctp_last_error (no C++ exception
// crosses into C or Python).
template <typename Fn>
int guarded(Fn&& fn) {
  try {
    fn();
    return 0;
  } catch (const std::exception& e) {
    last_error() = e.what();
  } catch (...) {
    last_error() = "asynctp: unknown exception";
  }
  return -1;
}

template <typename T>
const T& require(const T* p, const char* function, const char* argument) {
  if (p == nullptr) raise(cat(function, ": ", argument, " is NULL"));
  return *p;
}

// The handles this library made and has not destroyed, each with its calls in flight: a handle that
// was destroyed (or never made) is refused by name instead of being read, and one is not destroyed
// while another thread's call is still using it.
class Registry {
 public:
  void add(const void* handle) {
    std::lock_guard<std::mutex> lock(mu_);
    live_[handle] = 0;
  }
  void enter(const void* handle, const char* function, const char* argument, const char* kind) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = live_.find(handle);
    if (it == live_.end()) raise(cat(function, ": ", argument, " is not a live ", kind, " (destroyed, or never made)"));
    ++it->second;
  }
  void leave(const void* handle) {
    std::lock_guard<std::mutex> lock(mu_);
    --live_.at(handle);
  }
  // Forgets `handle`, which its caller then frees; false for NULL (nothing to do). `refuse`, where
  // given, runs once the handle is known live and may refuse to let it go (its message, or "").
  bool remove(const void* handle, const char* function, const char* argument, const char* kind,
              const std::function<std::string()>& refuse = nullptr) {
    if (handle == nullptr) return false;
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = live_.find(handle);
    if (it == live_.end()) {
      raise(cat(function, ": ", argument, " is not a live ", kind, " (destroyed already, or never made)"));
    }
    if (it->second > 0) {
      raise(cat(function, ": ", argument, " is in use by ", it->second, " call(s) on other threads; destroy it once ",
                "they have returned"));
    }
    if (refuse) {
      const std::string why = refuse();
      if (!why.empty()) raise(why);
    }
    live_.erase(it);
    return true;
  }

 private:
  std::mutex mu_;
  std::unordered_map<const void*, int> live_;
};

// The live communicators and in-process groups (never destroyed: a handle may be used during static
// destruction).
Registry& comms();
Registry& groups();
Registry& symmetrics();

// A live handle, held for the length of one call: it cannot be destroyed meanwhile.
template <typename Handle>
class Held {
 public:
  Held(Registry& registry, const Handle* handle, const char* function, const char* argument, const char* kind)
      : registry_(registry), handle_(handle) {
    if (handle == nullptr) raise(cat(function, ": ", argument, " is NULL (never created, or destroyed)"));
    registry.enter(handle, function, argument, kind);
  }
  ~Held() { registry_.leave(handle_); }
  Held(const Held&) = delete;
  Held& operator=(const Held&) = delete;
  const Handle* operator->() const { return handle_; }

 private:
  Registry& registry_;
  const Handle* handle_;
};

struct CommUse : Held<asynctp_comm> {
  CommUse(const asynctp_comm* c, const char* function) : Held(comms(), c, function, "comm", "communicator") {}
  asynctp::Communicator& comm() const { return *(*this)->comm; }
};

}  // namespace asynctp::capi
