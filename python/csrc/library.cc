#include "library.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <unordered_map>

namespace asynctp::torch_ext {
namespace {

std::mutex mutex;
asynctp_torch_c_functions functions{};
bool initialised = false;
asynctp_torch_factory factory = nullptr;
// Each thread keeps the communicators it was given: the ranks of PyTorch's threaded process group are
// threads that share a group's name, each with a communicator of its own. A group forgotten on any
// thread moves `generation` on, which empties every thread's map at its next lookup.
std::atomic<uint64_t> generation{0};
struct ThreadGroups {
  uint64_t generation = 0;
  std::unordered_map<std::string, Group> groups;
};
thread_local ThreadGroups mine;

}  // namespace

const asynctp_torch_c_functions& c_functions() {
  std::lock_guard<std::mutex> lock(mutex);
  TORCH_CHECK(initialised, "asynctp: libasynctp_torch.so was loaded without asynctp_torch_init: import asynctp's "
              "package (import asynctp.ops) instead of loading the library by hand");
  return functions;
}

Group group(const std::string& name) {
  const uint64_t now = generation.load(std::memory_order_acquire);
  if (mine.generation != now) {
    mine.groups.clear();
    mine.generation = now;
  }
  auto it = mine.groups.find(name);
  if (it != mine.groups.end()) return it->second;
  asynctp_torch_factory make = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex);
    make = factory;
  }
  TORCH_CHECK(make != nullptr, "asynctp: no communicator factory is set: import asynctp.ops first");
  // Called without the lock: making a communicator is collective and may take seconds, and the factory
  // (Python) may call back into this library.
  Group g;
  char why[1024] = {};
  TORCH_CHECK(make(name.c_str(), &g.comm, why, sizeof why) == 0 && g.comm != nullptr, why);
  const asynctp_torch_c_functions& c = c_functions();
  check(c.comm_world_size(g.comm, &g.world_size));
  check(c.comm_device(g.comm, &g.device));
  mine.groups[name] = g;
  return g;
}

void check(int rc) {
  if (rc != 0) TORCH_CHECK(false, c_functions().last_error());
}

}  // namespace asynctp::torch_ext

extern "C" int asynctp_torch_init(const asynctp_torch_c_functions* functions) {
  if (functions == nullptr || functions->c_api_version != ASYNCTP_C_API_VERSION) return -1;
  std::lock_guard<std::mutex> lock(asynctp::torch_ext::mutex);
  asynctp::torch_ext::functions = *functions;
  asynctp::torch_ext::initialised = true;
  return 0;
}

extern "C" void asynctp_torch_set_factory(asynctp_torch_factory factory) {
  std::lock_guard<std::mutex> lock(asynctp::torch_ext::mutex);
  asynctp::torch_ext::factory = factory;
}

extern "C" void asynctp_torch_forget_group(const char* /*group*/) {
  // Every thread's map is emptied, not the group's entries alone: another thread's map cannot be
  // touched from here, and asking the factory again costs one lookup of the package's.
  asynctp::torch_ext::generation.fetch_add(1, std::memory_order_acq_rel);
}
