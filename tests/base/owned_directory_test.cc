#include "base/owned_directory.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/file.h"
#include "gtest/gtest.h"
#include "tests/testutil/testutil.h"

namespace strata {
namespace {

// A process that made an owned directory and died without removing it (as
// kill -9 leaves one): its lock is gone with it. Returns the directory.
std::string AbandonedBy(const std::string& parent, const std::string& prefix) {
  int pipe_fds[2];
  EXPECT_EQ(::pipe(pipe_fds), 0);
  const pid_t child = ::fork();
  if (child == 0) {
    auto dir = OwnedDirectory::Create(parent, prefix);
    if (!dir.ok()) ::_exit(1);
    const std::string path = (*dir)->path();
    const bool wrote = WriteFileAtomically(JoinPath(path, "slots.bin"), std::string(5000, 'x')).ok();
    if (::write(pipe_fds[1], path.data(), path.size()) != static_cast<ssize_t>(path.size())) ::_exit(1);
    ::_exit(wrote ? 0 : 1);  // no destructor runs: the directory stays
  }
  ::close(pipe_fds[1]);
  char buffer[4096];
  const ssize_t n = ::read(pipe_fds[0], buffer, sizeof(buffer));
  ::close(pipe_fds[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  return n > 0 ? std::string(buffer, static_cast<size_t>(n)) : std::string();
}

TEST(OwnedDirectoryTest, ASweepRemovesOnlyDirectoriesWhoseOwnerIsGone) {
  testing::TempDir root;
  const std::string parent = root.Join("nvme");
  const std::string dead = AbandonedBy(parent, "strata-rank0");
  ASSERT_FALSE(dead.empty());
  ASSERT_TRUE(IsDirectory(dead));
  auto live = OwnedDirectory::Create(parent, "strata-rank1");  // held by this process
  ASSERT_TRUE(live.ok()) << live.status();
  ASSERT_EQ(::mkdir(JoinPath(parent, "strata-rank2-manual").c_str(), 0755), 0);  // no OWNER: not ours
  ASSERT_EQ(::mkdir(JoinPath(parent, "other-XYZ").c_str(), 0755), 0);

  const SweepResult swept = SweepAbandonedDirectories(parent, "strata-rank");
  EXPECT_EQ(swept.removed, std::vector<std::string>{dead});
  EXPECT_EQ(swept.bytes, 5000);
  EXPECT_TRUE(swept.failed.empty());
  EXPECT_FALSE(IsDirectory(dead));
  EXPECT_TRUE(IsDirectory((*live)->path()));
  EXPECT_TRUE(IsDirectory(JoinPath(parent, "strata-rank2-manual")));
  EXPECT_TRUE(IsDirectory(JoinPath(parent, "other-XYZ")));
  // Sweeping again finds nothing; a missing parent sweeps nothing.
  EXPECT_TRUE(SweepAbandonedDirectories(parent, "strata-rank").removed.empty());
  EXPECT_TRUE(SweepAbandonedDirectories(root.Join("missing"), "strata-rank").removed.empty());
}

TEST(OwnedDirectoryTest, TheOwnerRemovesItsDirectory) {
  testing::TempDir root;
  std::string path;
  {
    auto dir = OwnedDirectory::Create(root.Join("a/b"), "job");
    ASSERT_FALSE(dir.ok()) << "a missing grandparent is an error naming it";
    EXPECT_NE(dir.status().message().find("a/b"), std::string::npos);
  }
  {
    auto dir = OwnedDirectory::Create(root.Join("a"), "job");
    ASSERT_TRUE(dir.ok()) << dir.status();
    path = (*dir)->path();
    ASSERT_TRUE(WriteFileAtomically(JoinPath(path, "x"), "y").ok());
  }
  EXPECT_FALSE(IsDirectory(path));
}

}  // namespace
}  // namespace strata
