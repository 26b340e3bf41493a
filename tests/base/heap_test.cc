#include "base/heap.h"

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace strata {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;

// The smaps entry of the mapping that holds `address` ("" if none), and
// its range.
struct Mapping {
  std::string entry;
  uintptr_t from = 0, to = 0;
};
Mapping MappingOf(const void* address) {
  const auto at = reinterpret_cast<uintptr_t>(address);
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  Mapping m;
  bool in_entry = false;
  while (std::getline(smaps, line)) {
    // A mapping's first line: "from-to perms ...", where other lines are "Key: value".
    const size_t dash = line.find('-'), space = line.find(' ');
    if (dash != std::string::npos && space != std::string::npos && dash < space && line.find(':') > space) {
      if (in_entry) break;
      const uintptr_t from = std::stoull(line.substr(0, dash), nullptr, 16);
      const uintptr_t to = std::stoull(line.substr(dash + 1, space - dash - 1), nullptr, 16);
      in_entry = from <= at && at < to;
      if (in_entry) m.from = from, m.to = to;
    }
    if (in_entry) m.entry += line + "\n";
  }
  return m;
}

TEST(HeapTest, ALargeBlockIsHugePageAlignedZeroedAndWritable) {
  const size_t bytes = (size_t{5} << 20) + 1;
  auto* block = static_cast<unsigned char*>(MapLargeBlock(bytes));
  ASSERT_NE(block, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(block) % kHugePage, 0u);
  EXPECT_EQ(block[0], 0);
  EXPECT_EQ(block[bytes - 1], 0);
  std::memset(block, 0xab, bytes);
  EXPECT_EQ(block[bytes - 1], 0xab);
  // Rounded up to whole small pages (no tail wasted on a huge page), with
  // nothing of the over-mapping left. (Its advice keeps the kernel from
  // merging it with a neighbour without it.)
  const Mapping m = MappingOf(block);
  ASSERT_FALSE(m.entry.empty());
  EXPECT_EQ(m.from, reinterpret_cast<uintptr_t>(block));
  EXPECT_EQ(m.to - m.from, (size_t{5} << 20) + 4096);
  UnmapLargeBlock(block, bytes);
  EXPECT_TRUE(MappingOf(block).entry.empty());
}

TEST(HeapTest, ALargeBlockIsAdvisedToUseHugePages) {
  if (!std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled")) {
    GTEST_SKIP() << "this kernel has no transparent huge pages";
  }
  void* block = MapLargeBlock(kOwnMappingBytes);
  ASSERT_NE(block, nullptr);
  const std::string entry = MappingOf(block).entry;
  // "hg": the mapping carries MADV_HUGEPAGE, without which the kernel's
  // usual "madvise" mode keeps it in 4 KiB pages.
  const size_t flags = entry.find("VmFlags:");
  ASSERT_NE(flags, std::string::npos) << entry;
  EXPECT_NE(entry.find(" hg", flags), std::string::npos) << entry;
  UnmapLargeBlock(block, kOwnMappingBytes);
}

TEST(HeapTest, ConfigureHeapIsAccepted) { EXPECT_TRUE(ConfigureHeap()); }

TEST(HeapTest, AReleasedLargeBlockIsTakenAgainWholeOrSplitAndJoined) {
  UnmapKeptLargeBlocks();
  const size_t bytes = size_t{8} << 20;
  size_t mapped = 0;
  void* block = TakeLargeBlock(bytes, &mapped);
  ASSERT_NE(block, nullptr);
  EXPECT_EQ(mapped, bytes);
  std::memset(block, 0x5a, bytes);
  ReleaseLargeBlock(block, mapped);
  EXPECT_FALSE(MappingOf(block).entry.empty());  // kept, not unmapped

  // A request up to a fifth smaller (the block at most 1.25 times it) reuses
  // it, pages and all.
  size_t again = 0;
  auto* reused = static_cast<unsigned char*>(TakeLargeBlock(bytes - bytes / 5, &again));
  EXPECT_EQ(reused, block);
  EXPECT_EQ(again, bytes);
  EXPECT_EQ(reused[bytes - 1], 0x5a);
  ReleaseLargeBlock(reused, again);

  // Two quarters take its head and the next quarter (holding a quarter
  // each, not the whole block), the rest staying kept; released, the
  // pieces join, and the whole size takes the block whole again.
  EXPECT_EQ(KeptLargeBlockBytes(), bytes);
  size_t first_quarter = 0, second_quarter = 0;
  auto* head = static_cast<unsigned char*>(TakeLargeBlock(bytes / 4, &first_quarter));
  auto* next = static_cast<unsigned char*>(TakeLargeBlock(bytes / 4, &second_quarter));
  EXPECT_EQ(head, block);
  EXPECT_EQ(next, head + bytes / 4);
  EXPECT_EQ(first_quarter, bytes / 4);
  EXPECT_EQ(second_quarter, bytes / 4);
  EXPECT_EQ(KeptLargeBlockBytes(), bytes / 2);
  EXPECT_EQ(next[0], 0x5a);                 // the same pages: nothing mapped anew
  ReleaseLargeBlock(head, first_quarter);   // no neighbour kept yet
  ReleaseLargeBlock(next, second_quarter);  // joins both its neighbours
  EXPECT_EQ(KeptLargeBlockBytes(), bytes);
  size_t whole = 0;
  void* joined = TakeLargeBlock(bytes, &whole);
  EXPECT_EQ(joined, block);
  EXPECT_EQ(whole, bytes);
  EXPECT_EQ(KeptLargeBlockBytes(), 0u);
  ReleaseLargeBlock(joined, whole);
  UnmapKeptLargeBlocks();
  EXPECT_EQ(KeptLargeBlockBytes(), 0u);
  EXPECT_TRUE(MappingOf(block).entry.empty());
}

TEST(HeapTest, KeptBlocksNeverHoldMoreThanTheMostEverInUse) {
  UnmapKeptLargeBlocks();
  size_t a_mapped = 0, b_mapped = 0;
  void* a = TakeLargeBlock(size_t{8} << 20, &a_mapped);
  ASSERT_NE(a, nullptr);
  ReleaseLargeBlock(a, a_mapped);  // kept: 8 MiB mapped, 8 the most in use
  // 16 MiB fits no kept block. Mapping it beside the kept one would map 24
  // MiB where no more than 16 were ever in use: the kept one goes first.
  EXPECT_EQ(KeptLargeBlockBytes(), a_mapped);
  void* b = TakeLargeBlock(size_t{16} << 20, &b_mapped);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(KeptLargeBlockBytes(), 0u);
  ReleaseLargeBlock(b, b_mapped);
  EXPECT_EQ(KeptLargeBlockBytes(), b_mapped);
  UnmapKeptLargeBlocks();
  EXPECT_EQ(KeptLargeBlockBytes(), 0u);
  EXPECT_TRUE(MappingOf(b).entry.empty());
}

}  // namespace
}  // namespace strata
