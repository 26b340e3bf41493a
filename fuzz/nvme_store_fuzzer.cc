// The NVMe store's MANIFEST and, after "\n----\n", its JOURNAL, as a
// restarted worker finds them: Open replays them; every id it then lists
// must be readable within its recorded size.
#include <filesystem>
#include <vector>

#include "base/file.h"
#include "fuzz/fuzz_util.h"
#include "offload/nvme/nvme_store.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const auto [manifest, journal] = strata::fuzz::SplitOnce(in);
  const std::string dir = strata::fuzz::ScratchDir() + "/store";
  strata::RemoveTree(dir);
  std::filesystem::create_directories(dir);
  strata::fuzz::WriteScratch("store/MANIFEST", manifest);
  if (!journal.empty()) strata::fuzz::WriteScratch("store/JOURNAL", journal);
  strata::offload::NvmeStoreOptions options;
  options.directory = dir;
  options.engine = strata::offload::IoEngineKind::kPosix;
  auto store = strata::offload::NvmeStore::Open(options);
  if (!store.ok()) return 0;
  for (const std::string& id : (*store)->Ids()) {
    auto bytes = (*store)->Size(id);
    strata::fuzz::Check(bytes.ok() && *bytes >= 0, "listed id has a size");
    if (*bytes > (1 << 20)) continue;
    std::vector<std::byte> out(static_cast<size_t>(*bytes));
    (void)(*store)->Get(id, out);
  }
  return 0;
}
