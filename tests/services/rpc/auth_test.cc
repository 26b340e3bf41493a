// Secrets on disk and the tokens file of a tenant deployment.
#include "services/rpc/auth.h"

#include <sys/stat.h>

#include "gtest/gtest.h"
#include "tests/testutil/testutil.h"

namespace strata::services {
namespace {

std::string Write(const testing::TempDir& dir, const std::string& name, const std::string& text, mode_t mode) {
  const std::string path = dir.Join(name);
  testing::WriteTextFile(path, text);
  ::chmod(path.c_str(), mode);
  return path;
}

TEST(SecretFileTest, PrivateFilesAreReadOthersAreRefusedNamingTheFix) {
  testing::TempDir dir;
  auto ok = ReadSecretFile(Write(dir, "ok", "  s3cret \n", 0600), "--token-file");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, "s3cret");
  for (mode_t mode : {0640, 0604, 0660, 0644}) {
    const std::string path = Write(dir, "open", "s3cret", mode);
    auto open = ReadSecretFile(path, "--token-file");
    EXPECT_EQ(open.status().code(), absl::StatusCode::kPermissionDenied) << mode;
    EXPECT_NE(open.status().message().find("chmod 600 " + path), std::string::npos) << open.status();
  }
  EXPECT_EQ(ReadSecretFile(Write(dir, "empty", " \n", 0600), "--token-file").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadSecretFile(dir.Join("missing"), "--token-file").status().code(), absl::StatusCode::kNotFound);
}

TEST(TokensFileTest, ParsesTenantsAndAdminsAndNamesBadLines) {
  testing::TempDir dir;
  auto callers = ReadTokensFile(
      Write(dir, "tokens", "# comment\n\nta alice\ntb bob  # trailing\ntr ops admin\n", 0600));
  ASSERT_TRUE(callers.ok()) << callers.status();
  ASSERT_EQ(callers->size(), 3u);
  EXPECT_EQ(callers->at("ta").tenant, "alice");
  EXPECT_FALSE(callers->at("ta").admin);
  EXPECT_FALSE(callers->at("ta").worker);
  EXPECT_TRUE(callers->at("tr").admin);
  const std::pair<std::string, std::string> bad[] = {
      {"ta alice\nta bob\n", ":2: this token is given twice"},
      {"ta\n", ":1: expected TOKEN TENANT [admin]"},
      {"ta alice root\n", ":1: expected TOKEN TENANT [admin]"},
      {"ta al/ice\n", ":1: tenant names"},
      {"# nothing\n", "holds no token"},
  };
  for (const auto& [text, error] : bad) {
    auto parsed = ReadTokensFile(Write(dir, "bad", text, 0600));
    EXPECT_FALSE(parsed.ok()) << text;
    EXPECT_NE(parsed.status().message().find(error), std::string::npos) << parsed.status();
  }
  EXPECT_EQ(ReadTokensFile(Write(dir, "open", "ta alice\n", 0644)).status().code(),
            absl::StatusCode::kPermissionDenied);
}

}  // namespace
}  // namespace strata::services
