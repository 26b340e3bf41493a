// Helpers shared by the fuzz targets: each target is one
// LLVMFuzzerTestOneInput over the bytes an attacker controls. Parsers that
// read files get those bytes through a file in a per-process scratch
// directory (on tmpfs where there is one).
#ifndef STRATA_FUZZ_FUZZ_UTIL_H_
#define STRATA_FUZZ_FUZZ_UTIL_H_

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

namespace strata::fuzz {

// A directory private to this process, created on first use.
inline const std::string& ScratchDir() {
  static const std::string dir = [] {
    const char* base = std::filesystem::is_directory("/dev/shm") ? "/dev/shm" : "/tmp";
    std::string d = std::string(base) + "/strata-fuzz-" + std::to_string(::getpid());
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

// Writes `bytes` to `name` inside ScratchDir() (replacing it); its path.
inline std::string WriteScratch(const std::string& name, std::string_view bytes) {
  const std::string path = ScratchDir() + "/" + name;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return path;
}

// Splits the input at the first "\n----\n": the part before it, and after.
inline std::pair<std::string_view, std::string_view> SplitOnce(std::string_view in) {
  constexpr std::string_view kSep = "\n----\n";
  const size_t at = in.find(kSep);
  if (at == std::string_view::npos) return {in, {}};
  return {in.substr(0, at), in.substr(at + kSep.size())};
}

// A failed invariant is a finding: stop so that libFuzzer saves the input.
inline void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz invariant failed: %s\n", what);
    std::abort();
  }
}

}  // namespace strata::fuzz

#endif  // STRATA_FUZZ_FUZZ_UTIL_H_
