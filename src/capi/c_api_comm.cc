// The C interface's communicators and in-process groups (asynctp/c_api.h).
#include <nccl.h>

#include <cstring>
#include <memory>

#include "asynctp/version.h"
#include "capi/handles.h"

using namespace asynctp::capi;  // NOLINT: the extern "C" functions below are not in a namespace

extern "C" {

int asynctp_get_unique_id(unsigned char* id) {
  return guarded([&] {
    if (id == nullptr) raise("asynctp_get_unique_id: id is NULL");
    static_assert(sizeof(ncclUniqueId) == ASYNCTP_C_UNIQUE_ID_BYTES, "ncclUniqueId changed size");
    ncclUniqueId nccl_id;
    const ncclResult_t r = ncclGetUniqueId(&nccl_id);
    if (r != ncclSuccess) raise(cat("asynctp_get_unique_id: ncclGetUniqueId failed: ", ncclGetErrorString(r)));
    std::memcpy(id, &nccl_id, sizeof nccl_id);
  });
}

int asynctp_comm_create(int rank, int world_size, const unsigned char* id, int device, int timeout_ms,
                        const char* tuning_cache, asynctp_comm** comm) {
  return guarded([&] {
    const char* fn = "asynctp_comm_create";
    if (comm == nullptr) raise(cat(fn, ": comm (the result) is NULL"));
    *comm = nullptr;
    if (id == nullptr) raise(cat(fn, ": id is NULL"));
    ncclUniqueId nccl_id;
    std::memcpy(&nccl_id, id, sizeof nccl_id);
    asynctp::CommunicatorOptions options;
    options.device = device;
    options.timeout_ms = timeout_ms;
    if (tuning_cache != nullptr) options.tuning_cache = tuning_cache;
    auto made = std::make_unique<asynctp_comm>();
    made->comm = asynctp::Communicator::create(rank, world_size, nccl_id, options);
    comms().add(made.get());
    *comm = made.release();
  });
}

int asynctp_comm_wrap(void* nccl_comm, int timeout_ms, const char* tuning_cache, void (*on_overdue)(void*),
                      void* on_overdue_arg, asynctp_comm** comm) {
  return guarded([&] {
    const char* fn = "asynctp_comm_wrap";
    if (comm == nullptr) raise(cat(fn, ": comm (the result) is NULL"));
    *comm = nullptr;
    if (nccl_comm == nullptr) raise(cat(fn, ": nccl_comm is NULL; pass an initialised ncclComm_t"));
    asynctp::CommunicatorOptions options;
    options.timeout_ms = timeout_ms;
    if (tuning_cache != nullptr) options.tuning_cache = tuning_cache;
    if (on_overdue != nullptr) options.on_overdue = [on_overdue, on_overdue_arg] { on_overdue(on_overdue_arg); };
    auto made = std::make_unique<asynctp_comm>();
    made->comm = asynctp::Communicator::wrap(static_cast<ncclComm_t>(nccl_comm), options);
    comms().add(made.get());
    *comm = made.release();
  });
}

int asynctp_nccl_versions(int* runtime, int* build) {
  return guarded([&] {
    if (runtime == nullptr || build == nullptr) raise("asynctp_nccl_versions: runtime and build must not be NULL");
    *runtime = asynctp::nccl_runtime_version();
    *build = asynctp::nccl_build_version();
  });
}

int asynctp_comm_destroy(asynctp_comm* comm) {
  return guarded([&] {
    const char* fn = "asynctp_comm_destroy";
    const auto has_symmetric = [&]() -> std::string {
      const int symmetric = comm->symmetrics.load();
      if (symmetric == 0) return {};
      return cat(fn, ": comm still has ", symmetric, " symmetric memory handle(s); destroy them first ",
                 "(asynctp_symmetric_destroy)");
    };
    if (comms().remove(comm, fn, "comm", "communicator", has_symmetric)) delete comm;
  });
}

int asynctp_in_process_group_create(int world_size, const int* devices, int num_devices, asynctp_group** group) {
  return guarded([&] {
    const char* fn = "asynctp_in_process_group_create";
    if (group == nullptr) raise(cat(fn, ": group (the result) is NULL"));
    *group = nullptr;
    if (num_devices < 0) raise(cat(fn, ": num_devices is ", num_devices, "; expected >= 0"));
    if (num_devices > 0 && devices == nullptr) raise(cat(fn, ": devices is NULL but num_devices is ", num_devices));
    asynctp::InProcessOptions options;
    if (num_devices > 0) options.devices.assign(devices, devices + num_devices);
    auto made = std::make_unique<asynctp_group>();
    made->group = asynctp::InProcessGroup::create(world_size, options);
    groups().add(made.get());
    *group = made.release();
  });
}

int asynctp_in_process_group_destroy(asynctp_group* group) {
  return guarded([&] {
    if (groups().remove(group, "asynctp_in_process_group_destroy", "group", "in-process group")) delete group;
  });
}

int asynctp_comm_create_in_process(asynctp_group* group, int rank, int timeout_ms, const char* tuning_cache,
                                   int sm_budget, asynctp_comm** comm) {
  return guarded([&] {
    const char* fn = "asynctp_comm_create_in_process";
    if (comm == nullptr) raise(cat(fn, ": comm (the result) is NULL"));
    *comm = nullptr;
    const Held<asynctp_group> held(groups(), group, fn, "group", "in-process group");
    asynctp::CommunicatorOptions options;
    options.timeout_ms = timeout_ms;
    options.sm_budget = sm_budget;
    if (tuning_cache != nullptr) options.tuning_cache = tuning_cache;
    auto made = std::make_unique<asynctp_comm>();
    made->comm = asynctp::Communicator::create_in_process(group->group, rank, options);
    comms().add(made.get());
    *comm = made.release();
  });
}

int asynctp_comm_rank(const asynctp_comm* comm, int* rank) {
  return guarded([&] {
    const char* fn = "asynctp_comm_rank";
    require(rank, fn, "rank");
    *rank = CommUse(comm, fn).comm().rank();
  });
}

int asynctp_comm_world_size(const asynctp_comm* comm, int* world_size) {
  return guarded([&] {
    const char* fn = "asynctp_comm_world_size";
    require(world_size, fn, "world_size");
    *world_size = CommUse(comm, fn).comm().world_size();
  });
}

int asynctp_comm_device(const asynctp_comm* comm, int* device) {
  return guarded([&] {
    const char* fn = "asynctp_comm_device";
    require(device, fn, "device");
    *device = CommUse(comm, fn).comm().device();
  });
}

}  // extern "C"
