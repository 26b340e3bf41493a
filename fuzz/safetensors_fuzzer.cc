// A safetensors file (header and data), then, after "\n----\n", an index
// (model.safetensors.index.json) naming shards: the two ways a checkpoint
// reaches a worker from a user's model directory.
#include <cstring>

#include "fuzz/fuzz_util.h"
#include "policies/checkpoint/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const auto [file, index] = strata::fuzz::SplitOnce(in);
  const std::string path = strata::fuzz::WriteScratch("single/model.safetensors", file);
  if (auto st = strata::policies::SafetensorsFile::Open(path); st.ok()) {
    for (const auto& t : (*st)->tensors()) {
      // Every view must lie inside the mapping: touch its first and last byte.
      if (!t.data.empty()) {
        volatile std::byte first = t.data.front(), last = t.data.back();
        (void)first;
        (void)last;
      }
    }
  }
  if (!index.empty()) {
    strata::fuzz::WriteScratch("sharded/model-00001-of-00001.safetensors", file);
    strata::fuzz::WriteScratch("sharded/model.safetensors.index.json", index);
    if (auto ckpt = strata::policies::Checkpoint::Open(strata::fuzz::ScratchDir() + "/sharded"); ckpt.ok()) {
      for (const std::string& name : (*ckpt)->Names()) (void)(*ckpt)->Get(name);
    }
  }
  return 0;
}
