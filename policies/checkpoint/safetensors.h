// Reader and writer for the safetensors format, single file and the sharded
// Hugging Face layout, without libtorch. Readers mmap the file and hand out
// views into the mapping; nothing is copied.
//
// File layout: an 8-byte little-endian u64 N, N bytes of JSON header, then the
// data buffer. The header maps tensor names to
// {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]} with offsets
// relative to the start of the data buffer, plus an optional
// "__metadata__": {string: string}.
//
// Element data is stored little-endian and handed out as raw bytes; this code
// only builds on little-endian hosts. A tensor's bytes are NOT guaranteed to be
// aligned to its element size (the format packs tensors back to back), so
// callers that need aligned access must copy.
#ifndef STRATA_POLICIES_CHECKPOINT_SAFETENSORS_H_
#define STRATA_POLICIES_CHECKPOINT_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/file.h"

namespace strata::policies {

// Element types this code understands. Other safetensors dtypes (U16, U32,
// U64, F8_*) are rejected as unknown.
enum class DType { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool };

// The safetensors spelling: "F64", "F32", "F16", "BF16", "I64", "I32", "I16",
// "I8", "U8", "BOOL". The returned view points at static storage.
std::string_view DTypeName(DType dtype);

// Inverse of DTypeName. INVALID_ARGUMENT naming `name` when unknown.
absl::StatusOr<DType> ParseDType(const std::string& name);

// Bytes per element (BOOL is one byte).
size_t DTypeSize(DType dtype);

// A tensor inside a mapped file. Valid only while the SafetensorsFile or
// Checkpoint it came from is alive.
struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;       // empty for a 0-d scalar
  std::span<const std::byte> data;  // exactly numel() * DTypeSize(dtype) bytes
  // Product of `shape` (1 for a scalar). Cannot overflow for views handed out
  // by SafetensorsFile, which validates the shape on open.
  int64_t numel() const;
};

// One .safetensors file, memory-mapped, with its header fully validated when
// opened. Immutable after Open, so const methods are safe from many threads.
class SafetensorsFile {
 public:
  // NOT_FOUND when `path` does not exist; INVALID_ARGUMENT naming the file
  // (and the tensor, where one is at fault) when the header is malformed or
  // does not agree with the file size.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);

  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  // nullptr when the file has no tensor called `name`.
  const TensorView* Find(const std::string& name) const;
  // All tensors, in increasing data-offset order.
  const std::vector<TensorView>& tensors() const { return tensors_; }
  // The "__metadata__" entry; empty when the file has none.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return file_->path(); }

 private:
  SafetensorsFile(std::unique_ptr<MappedFile> file, std::vector<TensorView> tensors,
                  std::map<std::string, std::string> metadata);

  std::unique_ptr<MappedFile> file_;
  std::vector<TensorView> tensors_;
  std::unordered_map<std::string, size_t> by_name_;  // index into tensors_
  std::map<std::string, std::string> metadata_;
};

// A model checkpoint: a directory holding model.safetensors or
// model.safetensors.index.json plus its shards (model.safetensors wins when
// both exist, as in Hugging Face transformers), or a path naming a single
// .safetensors file or an index file directly. Every shard is opened once and
// validated up front. Immutable after Open; const methods are thread-safe.
class Checkpoint {
 public:
  // NOT_FOUND when `path`, or a shard the index names, does not exist (the
  // message names the shard and the index). INVALID_ARGUMENT when the index is
  // malformed, a shard is malformed, or the index lists a tensor its shard
  // lacks.
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Open(const std::string& path);

  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;

  // The tensor's view (valid while this Checkpoint lives). NOT_FOUND naming
  // the tensor and the checkpoint path when absent.
  absl::StatusOr<TensorView> Get(const std::string& name) const;
  bool Has(const std::string& name) const { return tensors_.contains(name); }
  // Every tensor name, sorted.
  std::vector<std::string> Names() const;
  // The path Open was given.
  const std::string& path() const { return path_; }

 private:
  Checkpoint(std::string path, std::vector<std::unique_ptr<SafetensorsFile>> files,
             std::map<std::string, const TensorView*> tensors)
      : path_(std::move(path)), files_(std::move(files)), tensors_(std::move(tensors)) {}

  std::string path_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorView*> tensors_;  // points into files_
};

// A tensor to serialize. `data` must hold exactly numel * DTypeSize(dtype)
// little-endian bytes and must stay valid for the duration of the write call.
struct TensorToWrite {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::span<const std::byte> data;
};

// Writes one safetensors file atomically and durably (temporary file, fsync,
// rename, fsync of the directory).
// Tensors are packed back to back in the given order, with no padding between
// them (Hugging Face's reader rejects gaps); put wider dtypes first if readers
// want aligned views. The header is padded with spaces so the data buffer
// starts at a multiple of 8 bytes. INVALID_ARGUMENT naming the tensor when a
// name is empty, duplicated or "__metadata__", a dimension is negative, or the
// data size does not match the shape.
absl::Status WriteSafetensors(const std::string& path, std::span<const TensorToWrite> tensors,
                              const std::map<std::string, std::string>& metadata = {});

// Writes a checkpoint into `dir` (created if missing; its parent must exist):
// dir/model.safetensors when the tensors' total size fits in max_shard_bytes
// or max_shard_bytes is 0, otherwise shards model-00001-of-0000n.safetensors,
// ... filled greedily in the given order (a tensor larger than max_shard_bytes
// gets a shard of its own) plus model.safetensors.index.json. Every shard
// carries `metadata`.
//
// Crash behaviour: each file is replaced atomically; the index is written only
// after every shard is durable, and files of the other layout (and shards the
// new index no longer names) are removed only after the new layout is in
// place. A crash therefore leaves either the old or the new checkpoint
// loadable, except that re-sharding into the same shard names overwrites
// shards in place before the new index lands; callers that need all-or-nothing
// replacement should write into a fresh directory and rename it.
absl::Status WriteCheckpoint(const std::string& dir, std::span<const TensorToWrite> tensors, size_t max_shard_bytes = 0,
                             const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

}  // namespace strata::policies

#endif  // STRATA_POLICIES_CHECKPOINT_SAFETENSORS_H_
