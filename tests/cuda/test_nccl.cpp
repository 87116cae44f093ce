#include <gtest/gtest.h>
TEST(Nccl, Placeholder) { GTEST_SKIP() << "todo"; }
