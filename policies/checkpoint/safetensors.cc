#include "policies/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>
#include <tuple>
#include <utility>

#include <nlohmann/json.hpp>
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"

namespace strata::policies {
namespace {

// Tensor bytes are handed out and written as-is; the format is little-endian.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

using Json = nlohmann::json;

constexpr char kSingleFileName[] = "model.safetensors";
constexpr char kIndexFileName[] = "model.safetensors.index.json";
constexpr char kMetadataKey[] = "__metadata__";
// The reference implementation refuses headers over 100 MB; a larger length
// field means a corrupt file, and refusing it early keeps a bad file from
// making us parse gigabytes of garbage.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct DTypeInfo {
  DType dtype;
  const char* name;
  size_t size;
};

constexpr DTypeInfo kDTypes[] = {
    {DType::kF64, "F64", 8}, {DType::kF32, "F32", 4},   {DType::kF16, "F16", 2}, {DType::kBF16, "BF16", 2},
    {DType::kI64, "I64", 8}, {DType::kI32, "I32", 4},   {DType::kI16, "I16", 2}, {DType::kI8, "I8", 1},
    {DType::kU8, "U8", 1},   {DType::kBool, "BOOL", 1},
};

const DTypeInfo& Info(DType dtype) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.dtype == dtype) return info;
  }
  return kDTypes[0];  // unreachable for valid enumerators
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Byte size of a tensor, or INVALID_ARGUMENT (without file or tensor prefix;
// callers add those) for a negative dimension or a product that overflows.
absl::StatusOr<uint64_t> CheckedByteSize(const std::vector<int64_t>& shape, DType dtype) {
  bool has_zero = false;
  for (int64_t d : shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(absl::StrCat("negative dimension ", d, " in shape ", ShapeString(shape)));
    }
    has_zero = has_zero || d == 0;
  }
  // A zero dimension makes the product zero however large the others are.
  if (has_zero) return 0;
  uint64_t bytes = DTypeSize(dtype);
  for (int64_t d : shape) {
    if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes) ||
        bytes > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return absl::InvalidArgumentError(absl::StrCat("shape ", ShapeString(shape), " is too large (size overflows)"));
    }
  }
  return bytes;
}

// Errors about a file's contents name the file first.
absl::Status Invalid(const std::string& path, const std::string& message) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", message));
}

absl::Status InvalidTensor(const std::string& path, const std::string& tensor, const std::string& message) {
  return Invalid(path, absl::StrCat("tensor '", tensor, "': ", message));
}

// Parses with exceptions so the message can say where the syntax broke;
// nlohmann's error text is the only detail worth passing on.
absl::StatusOr<Json> ParseJson(const char* begin, const char* end, const std::string& path, const std::string& what) {
  try {
    return Json::parse(begin, end);
  } catch (const Json::exception& e) {
    return Invalid(path, absl::StrCat(what, " is not valid JSON: ", e.what()));
  }
}

// A tensor header entry before its data span is known.
struct Entry {
  TensorView view;
  uint64_t begin = 0;
  uint64_t end = 0;
};

// Reads a JSON integer that must be non-negative; nlohmann stores every
// non-negative integer literal as unsigned, so a signed one is negative.
absl::StatusOr<uint64_t> NonNegativeInteger(const Json& value, const std::string& what) {
  if (value.is_number_unsigned()) return value.get<uint64_t>();
  if (value.is_number_integer()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is negative (", value.get<int64_t>(), ")"));
  }
  return absl::InvalidArgumentError(absl::StrCat(what, " must be an integer, got ", value.dump()));
}

absl::StatusOr<Entry> ParseEntry(const std::string& path, const std::string& name, const Json& value,
                                 uint64_t buffer_size) {
  if (!value.is_object()) {
    return InvalidTensor(path, name, absl::StrCat("entry must be an object, got ", value.dump()));
  }
  Entry entry;
  entry.view.name = name;

  const auto dtype_it = value.find("dtype");
  if (dtype_it == value.end()) return InvalidTensor(path, name, "missing \"dtype\"");
  if (!dtype_it->is_string()) return InvalidTensor(path, name, "\"dtype\" must be a string");
  absl::StatusOr<DType> dtype = ParseDType(dtype_it->get<std::string>());
  if (!dtype.ok()) return InvalidTensor(path, name, std::string(dtype.status().message()));
  entry.view.dtype = *dtype;

  const auto shape_it = value.find("shape");
  if (shape_it == value.end()) return InvalidTensor(path, name, "missing \"shape\"");
  if (!shape_it->is_array()) return InvalidTensor(path, name, "\"shape\" must be an array");
  for (const Json& dim : *shape_it) {
    if (dim.is_number_unsigned()) {
      const uint64_t d = dim.get<uint64_t>();
      if (d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return InvalidTensor(path, name, absl::StrCat("dimension ", d, " is too large"));
      }
      entry.view.shape.push_back(static_cast<int64_t>(d));
    } else if (dim.is_number_integer()) {
      entry.view.shape.push_back(dim.get<int64_t>());  // negative; rejected below
    } else {
      return InvalidTensor(path, name, absl::StrCat("\"shape\" must hold integers, got ", shape_it->dump()));
    }
  }
  absl::StatusOr<uint64_t> bytes = CheckedByteSize(entry.view.shape, entry.view.dtype);
  if (!bytes.ok()) return InvalidTensor(path, name, std::string(bytes.status().message()));

  const auto offsets_it = value.find("data_offsets");
  if (offsets_it == value.end()) return InvalidTensor(path, name, "missing \"data_offsets\"");
  if (!offsets_it->is_array() || offsets_it->size() != 2) {
    return InvalidTensor(path, name, absl::StrCat("\"data_offsets\" must be [begin, end], got ", offsets_it->dump()));
  }
  absl::StatusOr<uint64_t> begin = NonNegativeInteger((*offsets_it)[0], "data_offsets begin");
  if (!begin.ok()) return InvalidTensor(path, name, std::string(begin.status().message()));
  absl::StatusOr<uint64_t> end = NonNegativeInteger((*offsets_it)[1], "data_offsets end");
  if (!end.ok()) return InvalidTensor(path, name, std::string(end.status().message()));
  const std::string offsets = absl::StrCat("data_offsets [", *begin, ", ", *end, "]");
  if (*begin > *end) return InvalidTensor(path, name, absl::StrCat(offsets, " has begin > end"));
  if (*end - *begin != *bytes) {
    return InvalidTensor(path, name,
                         absl::StrCat("shape ", ShapeString(entry.view.shape), " of ", Info(entry.view.dtype).name,
                                      " needs ", *bytes, " bytes but ", offsets, " span ", *end - *begin));
  }
  if (*end > buffer_size) {
    return InvalidTensor(path, name,
                         absl::StrCat(offsets, " run past the end of the ", buffer_size,
                                      "-byte data buffer (file truncated?)"));
  }
  entry.begin = *begin;
  entry.end = *end;
  return entry;
}

absl::StatusOr<std::map<std::string, std::string>> ParseMetadata(const std::string& path, const Json& value) {
  if (!value.is_object()) return Invalid(path, "\"__metadata__\" must be an object");
  std::map<std::string, std::string> metadata;
  for (const auto& [key, item] : value.items()) {
    if (!item.is_string()) {
      return Invalid(path, absl::StrCat("\"__metadata__\" value for '", key, "' must be a string, got ", item.dump()));
    }
    metadata.emplace(key, item.get<std::string>());
  }
  return metadata;
}

// Checks the set of tensors to write; `path` is only for messages.
absl::Status ValidateTensorsToWrite(const std::string& path, std::span<const TensorToWrite> tensors) {
  std::set<std::string> seen;
  for (const TensorToWrite& t : tensors) {
    const std::string context = absl::StrCat("cannot write ", path);
    if (t.name.empty()) return Invalid(context, "tensor with an empty name");
    if (t.name == kMetadataKey) {
      return InvalidTensor(context, t.name, "name is reserved for file metadata");
    }
    if (!seen.insert(t.name).second) return InvalidTensor(context, t.name, "duplicate name");
    absl::StatusOr<uint64_t> bytes = CheckedByteSize(t.shape, t.dtype);
    if (!bytes.ok()) return InvalidTensor(context, t.name, std::string(bytes.status().message()));
    if (*bytes != t.data.size()) {
      return InvalidTensor(context, t.name,
                           absl::StrCat("shape ", ShapeString(t.shape), " of ", Info(t.dtype).name, " needs ", *bytes,
                                        " bytes but data has ", t.data.size()));
    }
  }
  return absl::OkStatus();
}

// Builds the space-padded header for tensors packed back to back in order.
absl::StatusOr<std::string> BuildHeader(const std::string& path, std::span<const TensorToWrite> tensors,
                                        const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    const uint64_t end = offset + t.data.size();
    header[t.name] = {{"dtype", Info(t.dtype).name}, {"shape", t.shape}, {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const Json::exception& e) {
    // Only invalid UTF-8 in a name or metadata string makes dump() throw.
    return Invalid(absl::StrCat("cannot write ", path), e.what());
  }
  // The data buffer starts 8-aligned, as the reference writer does, so
  // 8-byte dtypes at offset 0 can be read in place.
  text.append((8 - text.size() % 8) % 8, ' ');
  if (text.size() > kMaxHeaderBytes) {
    return Invalid(absl::StrCat("cannot write ", path), absl::StrCat("header of ", text.size(), " bytes exceeds the ",
                                                                     kMaxHeaderBytes, "-byte limit readers enforce"));
  }
  return text;
}

absl::Status MakeDirectory(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0755) == 0) return absl::OkStatus();
  if (errno == EEXIST && IsDirectory(dir)) return absl::OkStatus();
  return ErrnoToStatus(errno, absl::StrCat("mkdir ", dir));
}

absl::Status RemoveIfExists(const std::string& path) {
  if (::unlink(path.c_str()) == 0 || errno == ENOENT) return absl::OkStatus();
  return ErrnoToStatus(errno, absl::StrCat("unlink ", path));
}

bool AllDigits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// True for Hugging Face shard names, "model-00001-of-00003.safetensors".
bool IsShardFileName(std::string_view name) {
  constexpr std::string_view kPrefix = "model-";
  constexpr std::string_view kSuffix = ".safetensors";
  if (!name.starts_with(kPrefix) || !name.ends_with(kSuffix)) return false;
  name.remove_prefix(kPrefix.size());
  name.remove_suffix(kSuffix.size());
  const size_t of = name.find("-of-");
  return of != std::string_view::npos && AllDigits(name.substr(0, of)) && AllDigits(name.substr(of + 4));
}

std::string ZeroPad5(size_t n) {
  std::string digits = std::to_string(n);
  if (digits.size() < 5) digits.insert(0, 5 - digits.size(), '0');
  return digits;
}

std::string ShardFileName(size_t index, size_t count) {
  return absl::StrCat("model-", ZeroPad5(index), "-of-", ZeroPad5(count), ".safetensors");
}

// Removes shard-named files in `dir` that are not in `keep`.
absl::Status RemoveStaleShards(const std::string& dir, const std::set<std::string>& keep) {
  std::error_code ec;
  std::vector<std::string> stale;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (IsShardFileName(name) && !keep.contains(name)) stale.push_back(name);
  }
  if (ec) return ErrnoToStatus(ec.value(), absl::StrCat("list ", dir));
  for (const std::string& name : stale) {
    STRATA_RETURN_IF_ERROR(RemoveIfExists(JoinPath(dir, name)));
  }
  return absl::OkStatus();
}

std::string DirName(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// A shard name from an index must stay inside the checkpoint directory.
bool IsSafeRelativePath(const std::string& name) {
  if (name.empty() || name.front() == '/') return false;
  for (std::string_view rest = name; !rest.empty();) {
    const size_t slash = rest.find('/');
    if (rest.substr(0, slash) == "..") return false;
    if (slash == std::string_view::npos) break;
    rest.remove_prefix(slash + 1);
  }
  return true;
}

}  // namespace

std::string_view DTypeName(DType dtype) { return Info(dtype).name; }

absl::StatusOr<DType> ParseDType(const std::string& name) {
  for (const DTypeInfo& info : kDTypes) {
    if (name == info.name) return info.dtype;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype \"", name, "\""));
}

size_t DTypeSize(DType dtype) { return Info(dtype).size; }

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

SafetensorsFile::SafetensorsFile(std::unique_ptr<MappedFile> file, std::vector<TensorView> tensors,
                                 std::map<std::string, std::string> metadata)
    : file_(std::move(file)), tensors_(std::move(tensors)), metadata_(std::move(metadata)) {
  by_name_.reserve(tensors_.size());
  for (size_t i = 0; i < tensors_.size(); ++i) by_name_.emplace(tensors_[i].name, i);
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(auto mapped, MappedFile::Open(path));
  const std::span<const std::byte> bytes = mapped->bytes();
  if (bytes.size() < 8) {
    return Invalid(path, absl::StrCat("file is ", bytes.size(), " bytes, too short for the 8-byte header length"));
  }
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), sizeof(header_len));  // little-endian host
  if (header_len > kMaxHeaderBytes) {
    return Invalid(path, absl::StrCat("header length ", header_len, " exceeds the ", kMaxHeaderBytes,
                                      "-byte limit (corrupt file?)"));
  }
  if (header_len > bytes.size() - 8) {
    return Invalid(path, absl::StrCat("header length ", header_len, " runs past the end of the ", bytes.size(),
                                      "-byte file"));
  }
  const char* header_begin = reinterpret_cast<const char*>(bytes.data() + 8);
  absl::StatusOr<Json> header = ParseJson(header_begin, header_begin + header_len, path, "header");
  if (!header.ok()) return header.status();
  if (!header->is_object()) return Invalid(path, "header must be a JSON object");

  const std::span<const std::byte> buffer = bytes.subspan(8 + header_len);
  std::map<std::string, std::string> metadata;
  std::vector<Entry> entries;
  entries.reserve(header->size());
  for (const auto& [key, value] : header->items()) {
    if (key == kMetadataKey) {
      STRATA_ASSIGN_OR_RETURN(metadata, ParseMetadata(path, value));
      continue;
    }
    STRATA_ASSIGN_OR_RETURN(auto entry, ParseEntry(path, key, value, buffer.size()));
    entries.push_back(std::move(entry));
  }

  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.begin, a.end, a.view.name) < std::tie(b.begin, b.end, b.view.name);
  });
  // Empty tensors occupy no bytes and so cannot overlap anything; among the
  // rest, sorted by begin, an overlap shows up as a begin before the furthest
  // end seen so far.
  const Entry* furthest = nullptr;
  for (const Entry& e : entries) {
    if (e.begin == e.end) continue;
    if (furthest != nullptr && e.begin < furthest->end) {
      return InvalidTensor(path, e.view.name,
                           absl::StrCat("data_offsets [", e.begin, ", ", e.end, "] overlap tensor '",
                                        furthest->view.name, "' [", furthest->begin, ", ", furthest->end, "]"));
    }
    if (furthest == nullptr || e.end > furthest->end) furthest = &e;
  }

  std::vector<TensorView> tensors;
  tensors.reserve(entries.size());
  for (Entry& e : entries) {
    e.view.data = buffer.subspan(e.begin, e.end - e.begin);
    tensors.push_back(std::move(e.view));
  }
  return std::unique_ptr<SafetensorsFile>(
      new SafetensorsFile(std::move(mapped), std::move(tensors), std::move(metadata)));
}

const TensorView* SafetensorsFile::Find(const std::string& name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

namespace {

std::map<std::string, const TensorView*> IndexAll(const SafetensorsFile& file) {
  std::map<std::string, const TensorView*> tensors;
  for (const TensorView& t : file.tensors()) tensors.emplace(t.name, &t);
  return tensors;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& path) {
  std::string single_path;
  std::string index_path;
  if (IsDirectory(path)) {
    // Same precedence as transformers' from_pretrained.
    if (const std::string p = JoinPath(path, kSingleFileName); IsRegularFile(p)) {
      single_path = p;
    } else if (const std::string q = JoinPath(path, kIndexFileName); IsRegularFile(q)) {
      index_path = q;
    } else {
      return absl::NotFoundError(
          absl::StrCat("checkpoint directory ", path, " has neither ", kSingleFileName, " nor ", kIndexFileName));
    }
  } else if (!IsRegularFile(path)) {
    return absl::NotFoundError(absl::StrCat("checkpoint ", path, " does not exist"));
  } else if (path.ends_with(".index.json")) {
    index_path = path;
  } else {
    single_path = path;
  }

  if (!single_path.empty()) {
    STRATA_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(single_path));
    std::map<std::string, const TensorView*> tensors = IndexAll(*file);
    std::vector<std::unique_ptr<SafetensorsFile>> files;
    files.push_back(std::move(file));
    return std::unique_ptr<Checkpoint>(new Checkpoint(path, std::move(files), std::move(tensors)));
  }

  STRATA_ASSIGN_OR_RETURN(auto text, ReadFileToString(index_path));
  absl::StatusOr<Json> index = ParseJson(text.data(), text.data() + text.size(), index_path, "index");
  if (!index.ok()) return index.status();
  const auto weight_map = index->is_object() ? index->find("weight_map") : index->end();
  if (!index->is_object() || weight_map == index->end() || !weight_map->is_object()) {
    return Invalid(index_path, "index has no \"weight_map\" object");
  }
  // Group by shard so each shard is mapped and validated once.
  std::map<std::string, std::vector<std::string>> names_by_shard;
  for (const auto& [name, shard] : weight_map->items()) {
    if (!shard.is_string()) {
      return Invalid(index_path,
                     absl::StrCat("weight_map entry for tensor '", name, "' must be a file name, got ", shard.dump()));
    }
    const std::string shard_name = shard.get<std::string>();
    if (!IsSafeRelativePath(shard_name)) {
      return Invalid(index_path, absl::StrCat("tensor '", name, "' maps to shard '", shard_name,
                                              "' outside the checkpoint directory"));
    }
    names_by_shard[shard_name].push_back(name);
  }

  const std::string dir = DirName(index_path);
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  std::map<std::string, const TensorView*> tensors;
  for (const auto& [shard_name, names] : names_by_shard) {
    const std::string shard_path = JoinPath(dir, shard_name);
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(shard_path);
    if (absl::IsNotFound(file.status())) {
      return absl::NotFoundError(absl::StrCat("shard ", shard_path, " named by index ", index_path, " (for tensor '",
                                              names.front(), "') does not exist: ", file.status().message()));
    }
    if (!file.ok()) return file.status();
    for (const std::string& name : names) {
      const TensorView* view = (*file)->Find(name);
      if (view == nullptr) {
        return InvalidTensor(shard_path, name,
                             absl::StrCat("listed in index ", index_path, " but absent from the shard"));
      }
      tensors.emplace(name, view);
    }
    files.push_back(*std::move(file));
  }
  return std::unique_ptr<Checkpoint>(new Checkpoint(path, std::move(files), std::move(tensors)));
}

absl::StatusOr<TensorView> Checkpoint::Get(const std::string& name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return absl::NotFoundError(absl::StrCat("tensor '", name, "' not found in checkpoint ", path_));
  }
  return *it->second;
}

std::vector<std::string> Checkpoint::Names() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [name, view] : tensors_) names.push_back(name);
  return names;
}

absl::Status WriteSafetensors(const std::string& path, std::span<const TensorToWrite> tensors,
                              const std::map<std::string, std::string>& metadata) {
  STRATA_RETURN_IF_ERROR(ValidateTensorsToWrite(path, tensors));
  STRATA_ASSIGN_OR_RETURN(auto header, BuildHeader(path, tensors, metadata));
  const uint64_t header_len = header.size();
  std::byte len_bytes[8];
  std::memcpy(len_bytes, &header_len, sizeof(len_bytes));  // little-endian host
  std::vector<std::span<const std::byte>> parts;
  parts.reserve(tensors.size() + 2);
  parts.emplace_back(len_bytes, sizeof(len_bytes));
  parts.emplace_back(reinterpret_cast<const std::byte*>(header.data()), header.size());
  for (const TensorToWrite& t : tensors) parts.push_back(t.data);
  return WriteFileAtomically(path, parts);
}

absl::Status WriteCheckpoint(const std::string& dir, std::span<const TensorToWrite> tensors, size_t max_shard_bytes,
                             const std::map<std::string, std::string>& metadata) {
  // Validate the whole set first: names must be unique across shards too, and
  // nothing on disk should change for a request that cannot succeed.
  STRATA_RETURN_IF_ERROR(ValidateTensorsToWrite(dir, tensors));
  STRATA_RETURN_IF_ERROR(MakeDirectory(dir));
  const std::string single_path = JoinPath(dir, kSingleFileName);
  const std::string index_path = JoinPath(dir, kIndexFileName);

  uint64_t total_bytes = 0;
  for (const TensorToWrite& t : tensors) total_bytes += t.data.size();

  if (max_shard_bytes == 0 || total_bytes <= max_shard_bytes) {
    // model.safetensors takes precedence over an index, so once it is in
    // place the old sharded files are dead and can go.
    STRATA_RETURN_IF_ERROR(WriteSafetensors(single_path, tensors, metadata));
    STRATA_RETURN_IF_ERROR(RemoveIfExists(index_path));
    return RemoveStaleShards(dir, {});
  }

  std::vector<std::span<const TensorToWrite>> shards;
  size_t start = 0;
  uint64_t shard_bytes = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint64_t size = tensors[i].data.size();
    if (i > start && shard_bytes + size > max_shard_bytes) {
      shards.push_back(tensors.subspan(start, i - start));
      start = i;
      shard_bytes = 0;
    }
    shard_bytes += size;
  }
  shards.push_back(tensors.subspan(start));

  Json weight_map = Json::object();
  std::set<std::string> shard_names;
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string name = ShardFileName(i + 1, shards.size());
    if (absl::Status s = WriteSafetensors(JoinPath(dir, name), shards[i], metadata); !s.ok()) {
      return s;
    }
    for (const TensorToWrite& t : shards[i]) weight_map[t.name] = name;
    shard_names.insert(name);
  }
  const Json index = {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", weight_map}};
  // Names were checked as UTF-8 when the shard headers were dumped.
  STRATA_RETURN_IF_ERROR(WriteFileAtomically(index_path, index.dump(2) + "\n"));
  // Only now may a stale model.safetensors go: while it exists it wins over
  // the index, so a crash before this point leaves the old checkpoint intact.
  STRATA_RETURN_IF_ERROR(RemoveIfExists(single_path));
  return RemoveStaleShards(dir, shard_names);
}

}  // namespace strata::policies
