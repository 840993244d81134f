// Version, argument and environment checks, and the shape of error messages. No GPU needed.
#include <gtest/gtest.h>

#include <thread>

#include <cublasLt.h>

#include <cstdlib>
#include <functional>
#include <string>

#include "asynctp/asynctp.h"
#include "asynctp/launcher.h"
#include "common/arg_name.h"
#include "common/check.h"
#include "common/env.h"

namespace asynctp {
namespace {

std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no asynctp::Error thrown>";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(Version, MismatchedNcclIsRefusedWithTheRemedy) {
  const std::string m = message_of([] { check_nccl_versions_match(22803, 22809); });
  EXPECT_TRUE(contains(m, "loaded at run time is 2.28.3")) << m;
  EXPECT_TRUE(contains(m, "built with NCCL 2.28.9")) << m;
  EXPECT_TRUE(contains(m, "LD_LIBRARY_PATH")) << m;
  EXPECT_NO_THROW(check_nccl_versions_match(22809, 22809));
}

TEST(Version, ThisBuildRunsOnTheNcclItWasBuiltWith) {
  EXPECT_EQ(nccl_runtime_version(), nccl_build_version());
  EXPECT_GE(nccl_build_version(), 22800);
}

TEST(Version, NonHopperGpuIsRefusedForHopperPaths) {
  const std::string m = message_of([] { check_hopper(8, 0, "NVIDIA A100", 1, "fused all_gather_matmul"); });
  EXPECT_TRUE(contains(m, "fused all_gather_matmul needs a Hopper GPU")) << m;
  EXPECT_TRUE(contains(m, "GPU 1 (NVIDIA A100) has compute capability 8.0")) << m;
  EXPECT_TRUE(contains(m, "'sequential' or 'pipelined'")) << m;
  EXPECT_THROW(check_hopper(10, 0, "B200", 0, "x"), Error);
  EXPECT_NO_THROW(check_hopper(9, 0, "NVIDIA H200", 0, "x"));
}

TEST(Communicator, BadRankOrWorldSizeIsRefusedBeforeAnyGpuWork) {
  ncclUniqueId id{};
  std::string m = message_of([&] { Communicator::create(2, 2, id); });
  EXPECT_TRUE(contains(m, "rank must be in [0, 2), got 2")) << m;
  m = message_of([&] { Communicator::create(0, 0, id); });
  EXPECT_TRUE(contains(m, "world_size must be >= 1, got 0")) << m;
  m = message_of([&] { Communicator::create(-1, 4, id); });
  EXPECT_TRUE(contains(m, "got -1")) << m;
  m = message_of([] { Communicator::wrap(nullptr); });
  EXPECT_TRUE(contains(m, "comm is null")) << m;
}

TEST(Errors, MessagesStartWithTheRankOnceKnown) {
  detail::set_thread_rank(-1);
  EXPECT_EQ(message_of([] { ASYNCTP_CHECK(false, "x was ", 3); }), "x was 3");
  detail::set_thread_rank(5);
  EXPECT_EQ(message_of([] { ASYNCTP_CHECK(false, "x was ", 3); }), "rank 5: x was 3");
  detail::set_thread_rank(-1);
}

// The rank in a message is that of the communicator whose call raised it: inside a call (RankScope,
// which every public entry taking a communicator opens) its rank, whatever other communicators this
// process or thread made; outside any call, the last communicator made on this thread, and none for a
// thread that made none (another thread's rank is not this one's).
TEST(Errors, TheRankIsTheCallingCommunicatorsNotTheProcesss) {
  detail::set_thread_rank(3);  // this thread made rank 3's communicator
  {
    const detail::RankScope call(1);  // a call on rank 1's communicator, made elsewhere
    EXPECT_EQ(message_of([] { ASYNCTP_CHECK(false, "x"); }), "rank 1: x");
    {
      const detail::RankScope nested(1);
      EXPECT_EQ(message_of([] { ASYNCTP_CHECK(false, "x"); }), "rank 1: x");
    }
    EXPECT_EQ(message_of([] { ASYNCTP_CHECK(false, "x"); }), "rank 1: x");
  }
  EXPECT_EQ(message_of([] { ASYNCTP_CHECK(false, "x"); }), "rank 3: x");
  std::string other;
  std::thread([&] { other = message_of([] { ASYNCTP_CHECK(false, "x"); }); }).join();
  EXPECT_EQ(other, "x");
  detail::set_thread_rank(-1);
}

TEST(Errors, LibraryCallFailuresNameTheCallAndTheCause) {
  const std::string cuda = message_of([] { ASYNCTP_CUDA_CHECK(cudaErrorInvalidValue); });
  EXPECT_TRUE(contains(cuda, "checks_test.cc:")) << cuda;  // where
  EXPECT_TRUE(contains(cuda, "failed: cudaErrorInvalidValue (invalid argument)")) << cuda;
  const std::string nccl = message_of([] { ASYNCTP_NCCL_CHECK(ncclInvalidArgument); });
  EXPECT_TRUE(contains(nccl, "ncclInvalidArgument (")) << nccl;
  EXPECT_TRUE(contains(nccl, "failed: invalid argument")) << nccl;
  const std::string cublas = message_of([] { ASYNCTP_CUBLAS_CHECK(CUBLAS_STATUS_NOT_SUPPORTED); });
  EXPECT_TRUE(contains(cublas, "CUBLAS_STATUS_NOT_SUPPORTED")) << cublas;
}

TEST(Errors, AnArgumentsNameIsPrintedWithItsIndex) {
  // The ops keep names as parts (host time per call) and print them only in a refusal.
  EXPECT_EQ(detail::cat("op: ", detail::ArgName("a_shard"), " is"), "op: a_shard is");
  EXPECT_EQ(detail::cat(detail::ArgName("bs", 0), ", ", detail::ArgName("outputs", 12)), "bs[0], outputs[12]");
}

TEST(Environment, TimeoutComesFromArgumentThenEnvironmentThenDefault) {
  ::unsetenv("ASYNCTP_TIMEOUT_MS");
  EXPECT_EQ(detail::resolve_timeout_ms(0), detail::kDefaultTimeoutMs);
  EXPECT_EQ(detail::resolve_timeout_ms(250), 250);
  ::setenv("ASYNCTP_TIMEOUT_MS", "1500", 1);
  EXPECT_EQ(detail::resolve_timeout_ms(0), 1500);
  EXPECT_EQ(detail::resolve_timeout_ms(250), 250);
  ::unsetenv("ASYNCTP_TIMEOUT_MS");
}

TEST(Environment, MalformedValuesAreRefusedByName) {
  for (const char* bad : {"abc", "-5", "0", "12ms", "99999999999"}) {
    ::setenv("ASYNCTP_TIMEOUT_MS", bad, 1);
    const std::string m = message_of([] { detail::resolve_timeout_ms(0); });
    EXPECT_TRUE(contains(m, std::string("ASYNCTP_TIMEOUT_MS='") + bad + "' is not a positive integer")) << m;
  }
  ::unsetenv("ASYNCTP_TIMEOUT_MS");
}

TEST(Environment, SwitchesAreZeroOrOne) {
  ::unsetenv("ASYNCTP_CHECK_NAN");
  EXPECT_FALSE(detail::knob_flag(detail::Knob::kCheckNan));
  ::setenv("ASYNCTP_CHECK_NAN", "0", 1);
  EXPECT_FALSE(detail::knob_flag(detail::Knob::kCheckNan));
  ::setenv("ASYNCTP_CHECK_NAN", "1", 1);
  EXPECT_TRUE(detail::knob_flag(detail::Knob::kCheckNan));
  for (const char* bad : {"yes", "2", "true"}) {
    ::setenv("ASYNCTP_CHECK_NAN", bad, 1);
    const std::string m = message_of([] { detail::knob_flag(detail::Knob::kCheckNan); });
    EXPECT_TRUE(contains(m, std::string("ASYNCTP_CHECK_NAN='") + bad + "' is not 0 or 1")) << m;
  }
  ::unsetenv("ASYNCTP_CHECK_NAN");
}

TEST(Environment, WordsAreOneOfTheKnobsValues) {
  ::unsetenv("ASYNCTP_FUSED_RS_PUSH");
  EXPECT_EQ(detail::knob_word(detail::Knob::kFusedRsPush), -1);
  ::setenv("ASYNCTP_FUSED_RS_PUSH", "", 1);
  EXPECT_EQ(detail::knob_word(detail::Knob::kFusedRsPush), -1);
  ::setenv("ASYNCTP_FUSED_RS_PUSH", "copy-engine", 1);
  EXPECT_EQ(detail::knob_word(detail::Knob::kFusedRsPush), 0);
  ::setenv("ASYNCTP_FUSED_RS_PUSH", "kernel", 1);
  EXPECT_EQ(detail::knob_word(detail::Knob::kFusedRsPush), 1);
  for (const char* bad : {"kernels", "copy", "Kernel"}) {
    ::setenv("ASYNCTP_FUSED_RS_PUSH", bad, 1);
    const std::string m = message_of([] { detail::knob_word(detail::Knob::kFusedRsPush); });
    EXPECT_TRUE(contains(m, std::string("ASYNCTP_FUSED_RS_PUSH='") + bad +
                                "' is not one of its values (expected copy-engine or kernel)"))
        << m;
  }
  ::unsetenv("ASYNCTP_FUSED_RS_PUSH");
}

// A knob read as another kind than its declaration is a library bug, refused rather than misread.
TEST(Environment, AKnobIsReadOnlyAsTheKindItIsDeclared) {
  const std::string m = message_of([] { detail::knob_int(detail::Knob::kCheckNan, 1); });
  EXPECT_TRUE(contains(m, "ASYNCTP_CHECK_NAN is read as another kind")) << m;
  EXPECT_STREQ(detail::knob_name(detail::Knob::kTimeoutMs), "ASYNCTP_TIMEOUT_MS");
  EXPECT_STREQ(detail::knob_name(detail::Knob::kFusedMaxSplits), "ASYNCTP_FUSED_MAX_SPLITS");
}

}  // namespace
}  // namespace asynctp
