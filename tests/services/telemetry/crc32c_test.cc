#include "services/telemetry/crc32c.h"

#include <string>

#include "gtest/gtest.h"

namespace strata::services {
namespace {

// RFC 3720, appendix B.4, and the customary check value of "123456789".
TEST(Crc32cTest, KnownVectors) {
  EXPECT_EQ(Crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(std::string(32, '\xFF')), 0x62A8AB43u);
  std::string ascending, descending;
  for (int i = 0; i < 32; ++i) {
    ascending.push_back(static_cast<char>(i));
    descending.push_back(static_cast<char>(31 - i));
  }
  EXPECT_EQ(Crc32c(ascending), 0x46DD794Eu);
  EXPECT_EQ(Crc32c(descending), 0x113FDB5Cu);
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(Crc32c(""), 0u);
}

// TFRecord's mask: rotate right by 15, add 0xa282ead8.
TEST(Crc32cTest, MaskRotatesAndOffsets) {
  const uint32_t crc = Crc32c("123456789");
  EXPECT_EQ(MaskedCrc32c("123456789"), ((crc >> 15) | (crc << 17)) + 0xA282EAD8u);
  EXPECT_EQ(MaskedCrc32c(""), 0xA282EAD8u);
}

}  // namespace
}  // namespace strata::services
