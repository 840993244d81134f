// Communicator::Impl::attached: one attachment per type, found again by its type, kept in the order
// made (the communicator detaches them newest first).
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "comm/attachment.h"
#include "comm/communicator_impl.h"

namespace asynctp {
namespace {

struct First final : comm::Attachment {
  int value = 1;
  void detach(bool) override {}
};
struct Second final : comm::Attachment {
  int value = 2;
  void detach(bool) override {}
};

TEST(Attachment, EachTypeIsMadeOnceAndFoundAgain) {
  Communicator::Impl m;
  int made = 0;
  auto make_first = [&made] {
    ++made;
    return std::make_unique<First>();
  };
  EXPECT_EQ(m.find_attached<First>(), nullptr);
  First& a = m.attached<First>(make_first);
  a.value = 10;
  First& again = m.attached<First>(make_first);
  EXPECT_EQ(&a, &again);
  EXPECT_EQ(made, 1);
  EXPECT_EQ(again.value, 10);
  EXPECT_EQ(m.find_attached<Second>(), nullptr);
  Second& b = m.attached<Second>([] { return std::make_unique<Second>(); });
  EXPECT_EQ(b.value, 2);
  EXPECT_EQ(m.find_attached<First>(), &a);
  EXPECT_EQ(m.find_attached<Second>(), &b);
  ASSERT_EQ(m.attachments.size(), 2u);
  EXPECT_EQ(m.attachments[0].second.get(), &a);
  EXPECT_EQ(m.attachments[1].second.get(), &b);
}

}  // namespace
}  // namespace asynctp
