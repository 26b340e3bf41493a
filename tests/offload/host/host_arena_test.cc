#include "offload/host/host_arena.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

#include "gtest/gtest.h"

namespace strata::offload {
namespace {

std::unique_ptr<HostArena> MakeArena(size_t capacity) {
  HostArenaOptions options;
  options.capacity_bytes = capacity;
  auto arena = HostArena::Create(options);
  EXPECT_TRUE(arena.ok()) << arena.status();
  return arena.ok() ? std::move(*arena) : nullptr;
}

TEST(HostArenaTest, BuffersAreExactSizeAndAligned) {
  auto arena = MakeArena(1 << 20);
  auto a = arena->Allocate(5000);  // not a power of two: reserved 8192, not 8192*2^k
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->size(), 5000u);
  EXPECT_EQ(a->reserved(), 8192u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data()) % 4096, 0u);
  std::memset(a->data(), 0xab, a->size());
  const auto stats = arena->stats();
  EXPECT_EQ(stats.requested_bytes, 5000u);
  EXPECT_EQ(stats.reserved_bytes, 8192u);
}

TEST(HostArenaTest, FreedSizesAreReusedWithoutGrowth) {
  auto arena = MakeArena(64 << 20);
  const std::vector<size_t> shapes = {4096 * 3, 1 << 20, 12345, 1 << 20, 777};
  size_t first_peak = 0;
  for (int iteration = 0; iteration < 5; ++iteration) {
    std::vector<HostBuffer> live;
    for (size_t s : shapes) {
      auto b = arena->Allocate(s);
      ASSERT_TRUE(b.ok()) << b.status();
      live.push_back(std::move(*b));
    }
    if (iteration == 0) first_peak = arena->stats().peak_reserved_bytes;
  }
  const auto stats = arena->stats();
  EXPECT_EQ(stats.peak_reserved_bytes, first_peak);  // later iterations only reused
  EXPECT_EQ(stats.requested_bytes, 0u);
  EXPECT_EQ(stats.live_buffers, 0u);
  EXPECT_EQ(stats.pooled_buffers, shapes.size());
}

TEST(HostArenaTest, ExhaustionIsAClearError) {
  auto arena = MakeArena(64 << 10);
  auto a = arena->Allocate(60 << 10);
  ASSERT_TRUE(a.ok());
  auto b = arena->Allocate(8 << 10);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(b.status().message().find("host arena"), std::string::npos);
}

TEST(HostArenaTest, MoveKeepsOwnershipAndReturnsOnce) {
  auto arena = MakeArena(1 << 20);
  {
    auto a = arena->Allocate(100);
    ASSERT_TRUE(a.ok());
    HostBuffer moved = std::move(*a);
    EXPECT_FALSE(a->valid());
    HostBuffer again;
    again = std::move(moved);
    EXPECT_EQ(arena->stats().live_buffers, 1u);
  }
  EXPECT_EQ(arena->stats().live_buffers, 0u);
  EXPECT_EQ(arena->stats().pooled_buffers, 1u);
}

TEST(HostArenaTest, InvalidOptionsNameTheField) {
  HostArenaOptions options;
  EXPECT_NE(HostArena::Create(options).status().message().find("capacity_bytes"), std::string::npos);
  options.capacity_bytes = 1 << 20;
  options.alignment = 1000;
  EXPECT_NE(HostArena::Create(options).status().message().find("alignment"), std::string::npos);
}

TEST(HostArenaTest, LockingPastMemlockLimitFailsUpFront) {
  const auto denied = CheckMemlock(2 << 20, 1 << 20, /*privileged=*/false);
  EXPECT_EQ(denied.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(denied.message().find("RLIMIT_MEMLOCK"), std::string::npos);
  EXPECT_TRUE(CheckMemlock(2 << 20, 1 << 20, /*privileged=*/true).ok());
  EXPECT_TRUE(CheckMemlock(1 << 20, 1 << 20, /*privileged=*/false).ok());
}

TEST(HostArenaTest, LockedArenaWorks) {
  HostArenaOptions options;
  options.capacity_bytes = 1 << 20;
  options.lock_memory = true;
  auto arena = HostArena::Create(options);
  if (!arena.ok() && MemlockLimitBytes() < options.capacity_bytes) {
    GTEST_SKIP() << "RLIMIT_MEMLOCK below 1 MiB here: " << arena.status();
  }
  ASSERT_TRUE(arena.ok()) << arena.status();
  EXPECT_TRUE((*arena)->stats().locked);
}

}  // namespace
}  // namespace strata::offload
