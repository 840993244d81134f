// The numbers and lists every tool's command line is parsed with (tools/cli/parse.h).
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "cli/parse.h"

namespace asynctp::tools {
namespace {

TEST(ToolCli, IntegersInRangeAreTakenAsWritten) {
  EXPECT_EQ(integer_in("0", 0, 10), 0);
  EXPECT_EQ(integer_in("10", 0, 10), 10);
  EXPECT_EQ(integer_in("-3", -5, 5), -3);
  EXPECT_EQ(integer_in("007", 0, 10), 7);
  EXPECT_EQ(integer_in("9223372036854775807", 0, std::numeric_limits<int64_t>::max()),
            std::numeric_limits<int64_t>::max());
}

// Each of these was taken (wrapped, cut short or read up to a stray character) by one of the tools'
// own parsers before they shared this one.
TEST(ToolCli, AnythingElseIsNotAnInteger) {
  const int64_t big = std::numeric_limits<int64_t>::max();
  for (const std::string bad : {"", "-", "+5", " 5", "5 ", "5x", "0x10", "1e3", "4294967298", "99999999999999999999",
                                "-99999999999999999999", "--5", "5-"}) {
    EXPECT_FALSE(integer_in(bad, 0, std::numeric_limits<int>::max()).has_value()) << "'" << bad << "'";
  }
  EXPECT_FALSE(integer_in("11", 0, 10).has_value());
  EXPECT_FALSE(integer_in("-1", 0, 10).has_value());
  EXPECT_FALSE(integer_in("9223372036854775808", 0, big).has_value());  // one past int64
}

TEST(ToolCli, ListsKeepTheirEmptyItems) {
  EXPECT_EQ(split("a,b,c", ','), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(split("", ','), (std::vector<std::string>{""}));
  EXPECT_EQ(split("a,", ','), (std::vector<std::string>{"a", ""}));
  EXPECT_EQ(split(",a", ','), (std::vector<std::string>{"", "a"}));
  EXPECT_EQ(split("4096x3584x8192", 'x'), (std::vector<std::string>{"4096", "3584", "8192"}));
}

}  // namespace
}  // namespace asynctp::tools
