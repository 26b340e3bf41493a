// CRC-32C (Castagnoli), as TFRecord framing needs it. Debian bookworm has no
// C++ CRC-32C library (Abseil's arrived after 20220623), so this is the
// table-driven form; tests check it against RFC 3720's vectors.
#ifndef STRATA_SERVICES_TELEMETRY_CRC32C_H_
#define STRATA_SERVICES_TELEMETRY_CRC32C_H_

#include <cstdint>
#include <string_view>

namespace strata::services {

uint32_t Crc32c(std::string_view data);

// TFRecord's masked form: CRCs of data that holds CRCs are weak, so the
// format rotates and offsets them.
uint32_t MaskedCrc32c(std::string_view data);

}  // namespace strata::services

#endif  // STRATA_SERVICES_TELEMETRY_CRC32C_H_
