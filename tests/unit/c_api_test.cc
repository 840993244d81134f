// The C interface's handles: one that was destroyed, or never made, is refused by name on every call
// that takes it (it used to be read, or freed a second time). No GPU needed: such handles are refused
// before anything else happens.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "asynctp/c_api.h"

namespace {

asynctp_comm* stale_comm() { return reinterpret_cast<asynctp_comm*>(static_cast<uintptr_t>(0x1000)); }
asynctp_group* stale_group() { return reinterpret_cast<asynctp_group*>(static_cast<uintptr_t>(0x2000)); }

std::string error() { return asynctp_last_error(); }

TEST(CApiHandles, AHandleThatIsNotLiveIsRefusedByNameNotRead) {
  int value = 0;
  EXPECT_EQ(asynctp_comm_rank(stale_comm(), &value), -1);
  EXPECT_EQ(error(), "asynctp_comm_rank: comm is not a live communicator (destroyed, or never made)");
  EXPECT_EQ(asynctp_comm_world_size(stale_comm(), &value), -1);
  EXPECT_EQ(asynctp_comm_device(stale_comm(), &value), -1);
  EXPECT_EQ(asynctp_comm_synchronize(stale_comm(), nullptr), -1);
  EXPECT_EQ(error(), "asynctp_comm_synchronize: comm is not a live communicator (destroyed, or never made)");
  asynctp_tensor t{};
  EXPECT_EQ(asynctp_all_gather_matmul(stale_comm(), &t, &t, 1, 0, &t, nullptr, nullptr, nullptr), -1);
  EXPECT_EQ(error(), "asynctp_all_gather_matmul: comm is not a live communicator (destroyed, or never made)");
  EXPECT_EQ(asynctp_matmul_reduce_scatter(stale_comm(), &t, &t, 0, 0, &t, nullptr, nullptr), -1);
  EXPECT_EQ(asynctp_all_gather_scaled_matmul(stale_comm(), &t, &t, 1, &t, &t, 0, &t, nullptr, nullptr, nullptr, 0, nullptr,
                                             nullptr),
            -1);
  EXPECT_EQ(error(), "asynctp_all_gather_scaled_matmul: comm is not a live communicator (destroyed, or never made)");
  EXPECT_EQ(asynctp_scaled_matmul_reduce_scatter(stale_comm(), &t, &t, &t, &t, 0, 0, &t, nullptr, nullptr, 0, nullptr, nullptr),
            -1);
  EXPECT_EQ(error(), "asynctp_scaled_matmul_reduce_scatter: comm is not a live communicator (destroyed, or never made)");
  EXPECT_EQ(asynctp_refuse_call(stale_comm(), "all_gather_matmul", "no", nullptr, 1), -1);
  EXPECT_EQ(error(), "asynctp_refuse_call: comm is not a live communicator (destroyed, or never made)");
  asynctp_comm* made = nullptr;
  EXPECT_EQ(asynctp_comm_create_in_process(stale_group(), 0, 0, nullptr, 0, &made), -1);
  EXPECT_EQ(error(), "asynctp_comm_create_in_process: group is not a live in-process group (destroyed, or never made)");
  EXPECT_EQ(made, nullptr);
}

TEST(CApiHandles, DestroyingAHandleThatIsNotLiveIsAnErrorAndNullIsNothing) {
  EXPECT_EQ(asynctp_comm_destroy(stale_comm()), -1);
  EXPECT_EQ(error(), "asynctp_comm_destroy: comm is not a live communicator (destroyed already, or never made)");
  EXPECT_EQ(asynctp_in_process_group_destroy(stale_group()), -1);
  EXPECT_EQ(error(), "asynctp_in_process_group_destroy: group is not a live in-process group (destroyed already, or "
                     "never made)");
  EXPECT_EQ(asynctp_comm_destroy(nullptr), 0);
  EXPECT_EQ(asynctp_in_process_group_destroy(nullptr), 0);
}

TEST(CApiWrap, ANullNcclCommunicatorIsRefusedByName) {
  asynctp_comm* made = reinterpret_cast<asynctp_comm*>(static_cast<uintptr_t>(0x3000));
  EXPECT_EQ(asynctp_comm_wrap(nullptr, 0, nullptr, nullptr, nullptr, &made), -1);
  EXPECT_EQ(error(), "asynctp_comm_wrap: nccl_comm is NULL; pass an initialised ncclComm_t");
  EXPECT_EQ(made, nullptr);  // the result is cleared before anything can fail
  EXPECT_EQ(asynctp_comm_wrap(nullptr, 0, nullptr, nullptr, nullptr, nullptr), -1);
  EXPECT_EQ(error(), "asynctp_comm_wrap: comm (the result) is NULL");
}

TEST(CApiWrap, TheNcclVersionsAreTheLoadedAndTheBuiltOnes) {
  int runtime = 0, build = 0;
  ASSERT_EQ(asynctp_nccl_versions(&runtime, &build), 0) << error();
  EXPECT_GE(build, 22800);  // NCCL >= 2.28
  EXPECT_EQ(runtime, build);  // the tests run on the NCCL they were built with
  EXPECT_EQ(asynctp_nccl_versions(nullptr, &build), -1);
}

}  // namespace
