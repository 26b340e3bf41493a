#include "base/file.h"

#include <sys/stat.h>
#include <unistd.h>

#include "gtest/gtest.h"
#include "tests/testutil/testutil.h"

namespace strata {
namespace {

TEST(FileTest, ErrnoMapsToGrpcCodes) {
  EXPECT_EQ(ErrnoToStatus(ENOENT, "x").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ErrnoToStatus(EACCES, "x").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(ErrnoToStatus(ENOSPC, "x").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(ErrnoToStatus(ENOSPC, "file.bin").message().find("file.bin"), std::string::npos);
}

TEST(FileTest, AtomicWriteThenReadRoundTrips) {
  testing::TempDir dir;
  const std::string path = dir.Join("a.txt");
  ASSERT_TRUE(WriteFileAtomically(path, "hello").ok());
  ASSERT_TRUE(WriteFileAtomically(path, "world!").ok());
  auto text = ReadFileToString(path);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "world!");
}

TEST(FileTest, AtomicWriteIntoMissingDirectoryFailsAndLeavesNothing) {
  testing::TempDir dir;
  const auto status = WriteFileAtomically(dir.Join("missing/a.txt"), "x");
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(status.message().find("missing/a.txt"), std::string::npos);
}

TEST(FileTest, AppendDurablyCreatesThenAppends) {
  testing::TempDir dir;
  const std::string path = dir.Join("lines.jsonl");
  ASSERT_TRUE(AppendDurably(path, "one\n").ok());
  ASSERT_TRUE(AppendDurably(path, "two\n").ok());
  auto text = ReadFileToString(path);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "one\ntwo\n");
  const auto into_missing = AppendDurably(dir.Join("missing/lines.jsonl"), "x");
  EXPECT_EQ(into_missing.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(into_missing.message().find("missing/lines.jsonl"), std::string::npos) << into_missing;
}

TEST(FileTest, SyncDirectoryNamesWhatItCannotOpen) {
  testing::TempDir dir;
  EXPECT_TRUE(SyncDirectory(dir.path()).ok());
  const auto missing = SyncDirectory(dir.Join("missing"));
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.message().find("missing"), std::string::npos) << missing;
}

TEST(FileTest, ReadMissingFileIsNotFound) {
  auto text = ReadFileToString("/nonexistent/strata/file");
  EXPECT_EQ(text.status().code(), absl::StatusCode::kNotFound);
}

TEST(FileTest, MappedFileSeesContents) {
  testing::TempDir dir;
  ASSERT_TRUE(WriteFileAtomically(dir.Join("m"), "abc").ok());
  auto mapped = MappedFile::Open(dir.Join("m"));
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  ASSERT_EQ((*mapped)->bytes().size(), 3u);
  EXPECT_EQ(static_cast<char>((*mapped)->bytes()[2]), 'c');
  EXPECT_FALSE(MappedFile::Open(dir.path()).ok());
}

// `rm -rf`: nested files and directories go, a link is removed without
// following it, and a path that is not there counts as removed.
TEST(FileTest, RemoveTreeRemovesEverythingButWhatALinkPointsAt) {
  testing::TempDir dir;
  const std::string tree = dir.Join("tree"), outside = dir.Join("outside");
  ASSERT_EQ(::mkdir(tree.c_str(), 0755), 0);
  ASSERT_EQ(::mkdir(JoinPath(tree, "a").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir(JoinPath(tree, "a/b").c_str(), 0755), 0);
  ASSERT_TRUE(WriteFileAtomically(JoinPath(tree, "a/b/f"), "x").ok());
  ASSERT_TRUE(WriteFileAtomically(JoinPath(tree, "g"), "y").ok());
  ASSERT_EQ(::mkdir(outside.c_str(), 0755), 0);
  ASSERT_TRUE(WriteFileAtomically(JoinPath(outside, "kept"), "z").ok());
  ASSERT_EQ(::symlink(outside.c_str(), JoinPath(tree, "link").c_str()), 0);

  EXPECT_TRUE(RemoveTree(tree));
  EXPECT_FALSE(IsDirectory(tree));
  EXPECT_TRUE(IsRegularFile(JoinPath(outside, "kept")));
  EXPECT_TRUE(RemoveTree(tree));                       // already gone
  EXPECT_TRUE(RemoveTree(JoinPath(outside, "kept")));  // a single file
  EXPECT_FALSE(IsRegularFile(JoinPath(outside, "kept")));
}

}  // namespace
}  // namespace strata
