// GPU tests: a C API communicator for one rank of a test's launch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "asynctp/c_api.h"
#include "gpu_test.h"

namespace asynctp::testing {

// A C API communicator for this rank: through an NCCL unique id, or an in-process group of the C API's
// own that rank 0 makes and the others are handed (the ranks are threads of one process then).
struct CComm {
  asynctp_comm* comm = nullptr;
  asynctp_group* group = nullptr;
  RankContext& ctx;
  CComm(RankContext& c, int timeout_ms) : ctx(c) {
    if (ctx.group) {
      if (ctx.rank == 0) {
        std::vector<int> devices;
        for (int r = 0; r < ctx.world_size; ++r) devices.push_back(ctx.group->device_of(r));
        RANK_CHECK(asynctp_in_process_group_create(ctx.world_size, devices.data(), ctx.world_size, &group) == 0,
                   asynctp_last_error());
      }
      const std::vector<std::string> all = ctx.allgather(std::to_string(reinterpret_cast<uintptr_t>(group)));
      group = reinterpret_cast<asynctp_group*>(static_cast<uintptr_t>(std::stoull(all[0])));
      RANK_CHECK(asynctp_comm_create_in_process(group, ctx.rank, timeout_ms, nullptr, 0, &comm) == 0,
                 asynctp_last_error());
    } else {
      unsigned char id[ASYNCTP_C_UNIQUE_ID_BYTES] = {};
      if (ctx.rank == 0) RANK_CHECK(asynctp_get_unique_id(id) == 0, asynctp_last_error());
      const std::vector<std::string> all = ctx.allgather(std::string(reinterpret_cast<const char*>(id), sizeof id));
      RANK_CHECK(asynctp_comm_create(ctx.rank, ctx.world_size, reinterpret_cast<const unsigned char*>(all[0].data()),
                                     ctx.device, timeout_ms, nullptr, &comm) == 0,
                 asynctp_last_error());
    }
  }
  ~CComm() {
    asynctp_comm_destroy(comm);
    ctx.barrier();
    if (ctx.rank == 0) asynctp_in_process_group_destroy(group);
  }
};

}  // namespace asynctp::testing
