#include "offload/nvme/nvme_store.h"

#include <mutex>

// On-disk layout of `NvmeStoreOptions::directory`:
//
//   LOCK          flock'ed while an NvmeStore has the directory open
//   MANIFEST      snapshot of which tensor lives in which slot file, replaced
//                 atomically
//   JOURNAL       the state changes since that snapshot, appended in place
//   <name>.slot   one preallocated (fallocate) file per tensor id, opened
//                 O_DIRECT; its length is the tensor's size rounded up to 4096
//
// Slot file names are derived from the tensor id alone: up to 64 characters
// of the id with everything outside [A-Za-z0-9._-] replaced by '_', a '-',
// the 16 hex digits of the id's FNV-1a 64-bit hash, and ".slot". The same id
// gets the same file in every store, so a directory can be checkpointed by
// copying it; MANIFEST + JOURNAL are still the authority on which file holds
// what.
//
// MANIFEST is text, one record per line:
//
//   strata-nvme-store 2 <generation>
//   slot <valid 0|1> <size> <capacity> <file> <id, C-escaped>
//   ...
//   end <number of slot lines> <FNV-1a 64 of every byte before this line, hex>
//
// A missing or mismatched end line means a truncated or corrupt manifest:
// Open returns DATA_LOSS naming the file rather than guessing. A version 1
// manifest (header "strata-nvme-store 1": no generation, no JOURNAL) is read
// as generation 0 and rewritten in this format by Open; any other version is
// FAILED_PRECONDITION naming the file and the version.
//
// JOURNAL is text as well. Its first line names the snapshot it continues;
// every further line is one commit, a group of operations that became
// durable together (one write + one fdatasync), numbered 1, 2, ...:
//
//   strata-nvme-journal 1 <generation> <FNV-1a 64 of the line before this field, hex>
//   <seq> <op> [<op> ...] <FNV-1a 64 of the line before this field, hex>
//
// where each <op> is one of
//
//   slot <capacity> <file> <id>   slot file created (invalid) or grown to
//                                 <capacity> bytes; contents unchanged
//   inv <id>                      contents invalid
//   val <size> <id>               contents valid, <size> bytes
//   rm <id>                       tensor removed
//
// and <id> is C-escaped with spaces written as \040, so no field holds a
// space. Past the last line the file is zero-filled preallocation (NUL bytes,
// so that an append overwrites written blocks and fdatasync need not commit
// a size change); readers ignore trailing NULs.
//
// Open loads MANIFEST and replays JOURNAL when its generation matches. A
// JOURNAL of an older generation is a leftover from before the latest
// snapshot and is ignored. A last line that lacks its newline or fails its
// checksum is a commit torn by a crash: it is dropped with a warning (safe by
// the ordering below). A bad line followed by good ones, a commit out of
// sequence or describing an impossible change, a JOURNAL newer than MANIFEST,
// or a version 2 MANIFEST without a JOURNAL is DATA_LOSS naming the JOURNAL
// and the line. If the journal held any commit (or anything was dropped),
// Open then compacts: it writes MANIFEST generation+1 (write temporary +
// fsync + rename + fsync of the directory) and afterwards empties JOURNAL for
// the new generation (truncate to the old header, zero-fill, fdatasync, then
// overwrite the header, fdatasync). A crash inside compaction leaves either
// the old generation's JOURNAL, ignored, or an empty one. The running store
// compacts the same way once JOURNAL holds more than
// max(journal_limit_bytes, size of MANIFEST) bytes.
//
// Crash safety. An `inv` commit is durable before any byte of a slot the
// on-disk state calls valid is overwritten, and a `val` commit is appended
// only after the slot's data has been written and fdatasync'ed (and, for a
// new slot file, after the directory holding its name was fsync'ed). A torn
// last commit therefore never hides anything unsafe: a torn `inv` means no
// data was written yet, a torn `val` leaves the slot invalid. So after a
// crash at any point a slot that MANIFEST + JOURNAL call valid holds exactly
// the bytes of a completed write; a half-written slot is never valid. Slot
// files that neither mentions (a crash between creating a slot and recording
// it, or between recording a removal and unlinking it) are deleted by Open.
//
// Failed writes. When a write fails (ENOSPC, EIO, ...) the tensor has no
// readable value in this store object: Get/StartRead return NOT_FOUND until a
// later write succeeds. If the failure came before any byte of an old value
// was overwritten, reopening the directory may still find that old value
// intact; it never finds a partial one.
//

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "base/file.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "offload/nvme/aligned_buffer.h"

namespace strata::offload {

namespace nvme_store_internal {

// One state change as a JOURNAL commit records it.
struct JournalOp {
  enum class Kind { kSlot, kInvalid, kValid, kRemove };
  Kind kind = Kind::kInvalid;
  std::string id;
  std::string file;      // kSlot
  int64_t capacity = 0;  // kSlot
  int64_t size = 0;      // kValid
};

}  // namespace nvme_store_internal

namespace {

using nvme_store_internal::JournalOp;

constexpr char kManifestName[] = "MANIFEST";
constexpr char kManifestTmpPrefix[] = "MANIFEST.tmp.";
constexpr char kJournalName[] = "JOURNAL";
constexpr char kLockName[] = "LOCK";
constexpr char kManifestMagic[] = "strata-nvme-store";
constexpr int kManifestVersion = 2;
constexpr char kJournalMagic[] = "strata-nvme-journal";
constexpr int kJournalVersion = 1;
constexpr char kSlotSuffix[] = ".slot";
constexpr int64_t kAlign = static_cast<int64_t>(kDirectIoAlignment);
// JOURNAL is zero-filled ahead of the appends in steps of this many bytes.
constexpr int64_t kJournalStep = int64_t{64} << 10;
// Engine tags carry (batch << kItemBits) | item.
constexpr int kItemBits = 24;
constexpr uint64_t kItemMask = (uint64_t{1} << kItemBits) - 1;

uint64_t Fnv1a64(std::string_view bytes) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (const unsigned char c : bytes) {
    hash ^= c;
    hash *= 0x100000001b3ull;
  }
  return hash;
}

std::string Hex64(uint64_t value) { return absl::StrFormat("%016x", value); }

int64_t PadToAlign(int64_t n) { return static_cast<int64_t>(RoundUpTo(static_cast<size_t>(n), kDirectIoAlignment)); }

// Prefixes a status with the tensor it concerns, keeping its code.
absl::Status ForTensor(const std::string& id, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat("tensor '", id, "': ", status.message()));
}

absl::Status PwriteAll(int fd, std::string_view data, int64_t offset, const std::string& path) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::pwrite(fd, data.data() + done, data.size() - done,
                               static_cast<off_t>(offset + static_cast<int64_t>(done)));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, absl::StrCat("write ", path));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

// Writes NUL bytes over [from, to) of `fd`.
absl::Status ZeroFill(int fd, int64_t from, int64_t to, const std::string& path) {
  static const std::string* const zeros = new std::string(static_cast<size_t>(kJournalStep), '\0');
  for (int64_t at = from; at < to;) {
    const int64_t n = std::min(to - at, kJournalStep);
    if (auto status = PwriteAll(fd, std::string_view(*zeros).substr(0, static_cast<size_t>(n)), at, path);
        !status.ok()) {
      return status;
    }
    at += n;
  }
  return absl::OkStatus();
}

// "<body> <FNV-1a 64 of body>\n": the shape of every JOURNAL line.
std::string ChecksummedLine(const std::string& body) { return absl::StrCat(body, " ", Hex64(Fnv1a64(body)), "\n"); }

// The body of a ChecksummedLine (without its newline), or nullopt when the
// checksum does not match.
std::optional<std::string_view> CheckedBody(std::string_view line) {
  constexpr size_t kHexDigits = 16;
  if (line.size() < kHexDigits + 2 || line[line.size() - kHexDigits - 1] != ' ') {
    return std::nullopt;
  }
  const std::string_view body = line.substr(0, line.size() - kHexDigits - 1);
  if (line.substr(line.size() - kHexDigits) != Hex64(Fnv1a64(body))) return std::nullopt;
  return body;
}

std::string JournalHeader(uint64_t generation) {
  return ChecksummedLine(absl::StrCat(kJournalMagic, " ", kJournalVersion, " ", generation));
}

// C-escaping leaves spaces alone; octal (not \x, which would swallow hex
// digits that follow) keeps the id a single space-free field.
std::string EscapeField(const std::string& id) { return absl::StrReplaceAll(absl::CEscape(id), {{" ", "\\040"}}); }

bool SlotFileNameIsSane(const std::string& file) {
  return file.find('/') == std::string::npos && absl::EndsWith(file, kSlotSuffix) &&
         file.size() > std::strlen(kSlotSuffix);
}

struct ManifestRecord {
  std::string id;
  std::string file;
  int64_t size = 0;
  int64_t capacity = 0;
  bool valid = false;
};

struct Snapshot {
  int version = 0;
  uint64_t generation = 0;  // 0 for version 1, which had none
  std::vector<ManifestRecord> records;
};

absl::StatusOr<Snapshot> ParseManifest(const std::string& text, const std::string& path) {
  auto corrupt = [&path](int line, const std::string& what) {
    return absl::DataLossError(
        absl::StrCat("NVMe store manifest ", path, line > 0 ? absl::StrCat(" line ", line) : "", ": ", what));
  };
  // The version first: another version's end record may differ.
  const std::vector<std::string> header = absl::StrSplit(text.substr(0, text.find('\n')), absl::MaxSplits(' ', 2));
  if (header.size() >= 2 && header[0] == kManifestMagic && header[1] != "1" &&
      header[1] != absl::StrCat(kManifestVersion)) {
    return absl::FailedPreconditionError(absl::StrCat("NVMe store manifest ", path, " has format version '",
                                                      absl::CHexEscape(header[1].substr(0, 32)),
                                                      "'; this build reads versions 1 and ", kManifestVersion));
  }
  if (text.empty() || text.back() != '\n') return corrupt(0, "truncated (no end record)");
  const size_t previous_newline = text.size() >= 2 ? text.rfind('\n', text.size() - 2) : std::string::npos;
  const size_t end_start = previous_newline == std::string::npos ? 0 : previous_newline + 1;
  const std::string body = text.substr(0, end_start);
  const std::vector<std::string> end_fields = absl::StrSplit(text.substr(end_start, text.size() - 1 - end_start), ' ');
  uint64_t count = 0;
  if (end_fields.size() != 3 || end_fields[0] != "end" || !absl::SimpleAtoi(end_fields[1], &count)) {
    return corrupt(0, "truncated (no end record)");
  }
  if (end_fields[2] != Hex64(Fnv1a64(body))) return corrupt(0, "checksum mismatch (corrupt)");

  std::vector<std::string> lines = absl::StrSplit(body, '\n');
  if (!lines.empty() && lines.back().empty()) lines.pop_back();
  Snapshot snapshot;
  const std::string v1_header = absl::StrCat(kManifestMagic, " 1");
  const std::string v2_prefix = absl::StrCat(kManifestMagic, " ", kManifestVersion, " ");
  if (!lines.empty() && lines[0] == v1_header) {
    snapshot.version = 1;
  } else if (!lines.empty() && absl::StartsWith(lines[0], v2_prefix) &&
             absl::SimpleAtoi(lines[0].substr(v2_prefix.size()), &snapshot.generation)) {
    snapshot.version = kManifestVersion;
  } else {
    return corrupt(1, absl::StrCat("expected header '", v2_prefix, "<generation>'"));
  }
  std::unordered_set<std::string> ids;
  std::unordered_set<std::string> files;
  for (size_t i = 1; i < lines.size(); ++i) {
    const int line = static_cast<int>(i) + 1;
    const std::vector<std::string> f = absl::StrSplit(lines[i], absl::MaxSplits(' ', 5));
    ManifestRecord r;
    if (f.size() != 6 || f[0] != "slot" || (f[1] != "0" && f[1] != "1") || !absl::SimpleAtoi(f[2], &r.size) ||
        !absl::SimpleAtoi(f[3], &r.capacity) || !absl::CUnescape(f[5], &r.id)) {
      return corrupt(line, "malformed slot record");
    }
    r.valid = f[1] == "1";
    r.file = f[4];
    if (r.size < 0 || r.capacity < 0 || r.capacity % kAlign != 0 || (r.valid && r.capacity < PadToAlign(r.size))) {
      return corrupt(line, absl::StrCat("impossible size ", r.size, " / capacity ", r.capacity));
    }
    if (!SlotFileNameIsSane(r.file)) {
      return corrupt(line, absl::StrCat("bad slot file name '", r.file, "'"));
    }
    if (!ids.insert(r.id).second || !files.insert(r.file).second) {
      return corrupt(line, absl::StrCat("duplicate record for '", r.id, "'"));
    }
    snapshot.records.push_back(std::move(r));
  }
  if (snapshot.records.size() != count) {
    return corrupt(0, absl::StrCat("end record counts ", count, " slots, found ", snapshot.records.size()));
  }
  return snapshot;
}

// What replaying a JOURNAL found.
struct JournalScan {
  int64_t used = 0;          // bytes of the header and the commits replayed
  int64_t header_bytes = 0;  // bytes of a well-formed header, of any generation
  uint64_t commits = 0;      // commits replayed
  // False only for a well-formed, empty journal of the current generation,
  // the one case where appending may simply continue.
  bool needs_compaction = false;
};

void AppendOp(const JournalOp& op, std::string* body) {
  switch (op.kind) {
    case JournalOp::Kind::kSlot:
      absl::StrAppend(body, " slot ", op.capacity, " ", op.file, " ", EscapeField(op.id));
      break;
    case JournalOp::Kind::kInvalid:
      absl::StrAppend(body, " inv ", EscapeField(op.id));
      break;
    case JournalOp::Kind::kValid:
      absl::StrAppend(body, " val ", op.size, " ", EscapeField(op.id));
      break;
    case JournalOp::Kind::kRemove:
      absl::StrAppend(body, " rm ", EscapeField(op.id));
      break;
  }
}

// Parses "<seq> <op> [<op> ...]"; an error message on malformed text.
absl::StatusOr<std::vector<JournalOp>> ParseCommit(std::string_view body, uint64_t* seq) {
  const std::vector<std::string> f = absl::StrSplit(std::string(body), ' ');
  // Wrapped with the file and line by the caller.
  auto malformed = [](const std::string& what) { return absl::DataLossError(what); };
  if (f.empty() || !absl::SimpleAtoi(f[0], seq)) return malformed("malformed sequence number");
  std::vector<JournalOp> ops;
  size_t i = 1;
  auto take_id = [&](JournalOp& op) { return i < f.size() && absl::CUnescape(f[i++], &op.id); };
  while (i < f.size()) {
    JournalOp op;
    const std::string& kind = f[i++];
    bool ok = false;
    if (kind == "slot") {
      op.kind = JournalOp::Kind::kSlot;
      ok = i + 1 < f.size() && absl::SimpleAtoi(f[i], &op.capacity) && !f[i + 1].empty();
      if (ok) {
        op.file = f[i + 1];
        i += 2;
        ok = take_id(op);
      }
    } else if (kind == "inv") {
      op.kind = JournalOp::Kind::kInvalid;
      ok = take_id(op);
    } else if (kind == "val") {
      op.kind = JournalOp::Kind::kValid;
      ok = i < f.size() && absl::SimpleAtoi(f[i++], &op.size) && take_id(op);
    } else if (kind == "rm") {
      op.kind = JournalOp::Kind::kRemove;
      ok = take_id(op);
    } else {
      return malformed(absl::StrCat("unknown operation '", absl::CHexEscape(kind.substr(0, 16)), "'"));
    }
    if (!ok) return malformed(absl::StrCat("malformed '", kind, "' operation"));
    ops.push_back(std::move(op));
  }
  if (ops.empty()) return malformed("commit without operations");
  return ops;
}

// Applies one replayed operation to the snapshot's slots, keyed by id;
// `owners` maps slot file to id. An error names the impossible change.
absl::Status ApplyOp(const JournalOp& op, std::map<std::string, ManifestRecord>& slots,
                     std::unordered_map<std::string, std::string>& owners) {
  auto it = slots.find(op.id);
  const std::string quoted = absl::StrCat("'", absl::CEscape(op.id), "'");
  switch (op.kind) {
    case JournalOp::Kind::kSlot: {
      if (op.capacity < 0 || op.capacity % kAlign != 0 || !SlotFileNameIsSane(op.file)) {
        return absl::DataLossError(absl::StrCat("impossible slot ", op.capacity, " ", op.file, " for ", quoted));
      }
      auto owner = owners.find(op.file);
      if (owner != owners.end() && owner->second != op.id) {
        return absl::DataLossError(absl::StrCat("slot file ", op.file, " of ", quoted, " already belongs to '",
                                                absl::CEscape(owner->second), "'"));
      }
      if (it == slots.end()) {
        ManifestRecord r;
        r.id = op.id;
        r.file = op.file;
        it = slots.emplace(op.id, std::move(r)).first;
        owners[op.file] = op.id;
      } else if (it->second.file != op.file) {
        return absl::DataLossError(absl::StrCat(quoted, " moved from ", it->second.file, " to ", op.file));
      }
      if (it->second.valid && op.capacity < PadToAlign(it->second.size)) {
        return absl::DataLossError(absl::StrCat("slot of ", quoted, " shrank below its contents"));
      }
      it->second.capacity = op.capacity;
      return absl::OkStatus();
    }
    case JournalOp::Kind::kInvalid:
      if (it == slots.end()) {
        return absl::DataLossError(absl::StrCat("invalidates unknown ", quoted));
      }
      it->second.valid = false;
      return absl::OkStatus();
    case JournalOp::Kind::kValid:
      if (it == slots.end()) return absl::DataLossError(absl::StrCat("validates unknown ", quoted));
      if (op.size < 0 || it->second.capacity < PadToAlign(op.size)) {
        return absl::DataLossError(
            absl::StrCat("impossible size ", op.size, " for ", quoted, " (capacity ", it->second.capacity, ")"));
      }
      it->second.size = op.size;
      it->second.valid = true;
      return absl::OkStatus();
    case JournalOp::Kind::kRemove:
      // Also written for slots that never reached the disk (see Remove).
      if (it != slots.end()) {
        owners.erase(it->second.file);
        slots.erase(it);
      }
      return absl::OkStatus();
  }
  return absl::OkStatus();
}

// Replays the JOURNAL text `text` onto `slots`, the MANIFEST of `generation`.
absl::StatusOr<JournalScan> ReplayJournal(const std::string& text, const std::string& path, uint64_t generation,
                                          std::map<std::string, ManifestRecord>& slots) {
  JournalScan scan;
  auto corrupt = [&path](int line, const std::string& what) {
    return absl::DataLossError(absl::StrCat("NVMe store journal ", path, " line ", line, ": ", what));
  };
  // Trailing NULs are preallocation (or a crash while it was written).
  const size_t last = text.find_last_not_of('\0');
  const std::string_view content = last == std::string::npos ? std::string_view()
                                                             : std::string_view(text).substr(0, last + 1);
  if (content.empty()) {
    // No header yet: only a crash while the first snapshot was being made
    // (generation 1) leaves that. Later compactions keep the old header
    // until the new one overwrites it, so an empty journal then was lost.
    if (generation > 1) {
      return absl::DataLossError(absl::StrCat("NVMe store journal ", path, " is empty but the manifest (generation ",
                                              generation, ") needs its records"));
    }
    scan.needs_compaction = true;
    return scan;
  }
  std::unordered_map<std::string, std::string> owners;
  for (const auto& [id, r] : slots) owners[r.file] = id;

  size_t pos = 0;
  for (int line = 1; pos < content.size(); ++line) {
    const size_t newline = content.find('\n', pos);
    const bool complete = newline != std::string_view::npos;
    const size_t next = complete ? newline + 1 : content.size();
    const bool is_last = next >= content.size();
    const std::optional<std::string_view> body = complete ? CheckedBody(content.substr(pos, newline - pos))
                                                          : std::nullopt;
    if (!body.has_value()) {
      const std::string why = complete ? "checksum mismatch" : "no end of line";
      if (!is_last) return corrupt(line, absl::StrCat(why, ", and records follow (corrupt)"));
      // Appends are the only writes, each made durable before the next: only
      // the last one can have been cut short by a crash.
      STRATA_LOG(Warning) << "NVMe store journal " << path << " line " << line << ": dropping a torn last record ("
                          << why << "); a crash interrupted its append";
      scan.needs_compaction = true;
      return scan;
    }
    if (line == 1) {
      const std::vector<std::string> f = absl::StrSplit(std::string(*body), ' ');
      uint64_t journal_generation = 0;
      if (f.size() != 3 || f[0] != kJournalMagic || f[1] != absl::StrCat(kJournalVersion) ||
          !absl::SimpleAtoi(f[2], &journal_generation)) {
        return corrupt(line, absl::StrCat("expected header '", kJournalMagic, " ", kJournalVersion, " <generation>'"));
      }
      scan.header_bytes = static_cast<int64_t>(next);
      if (journal_generation > generation) {
        return corrupt(line, absl::StrCat("journal of generation ", journal_generation,
                                          " is newer than the manifest's ", generation));
      }
      if (journal_generation < generation) {
        // Written before the latest snapshot, which already holds all of it.
        STRATA_LOG(Info) << "ignoring NVMe store journal " << path << " of generation " << journal_generation
                         << " (manifest has " << generation << ")";
        scan.needs_compaction = true;
        return scan;
      }
    } else {
      uint64_t seq = 0;
      auto ops = ParseCommit(*body, &seq);
      if (!ops.ok()) return corrupt(line, std::string(ops.status().message()));
      if (seq != scan.commits + 1) {
        return corrupt(line, absl::StrCat("commit ", seq, " where ", scan.commits + 1, " was expected"));
      }
      for (const JournalOp& op : *ops) {
        if (auto status = ApplyOp(op, slots, owners); !status.ok()) {
          return corrupt(line, std::string(status.message()));
        }
      }
      ++scan.commits;
      scan.needs_compaction = true;
    }
    scan.used = static_cast<int64_t>(next);
    pos = next;
  }
  return scan;
}

}  // namespace

namespace nvme_store_internal {

// The JOURNAL file. Commits overwrite zero-filled space past the last one, so
// their fdatasync rarely has a size change to commit.
class Journal {
 public:
  static absl::StatusOr<std::unique_ptr<Journal>> Open(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("open ", path));
    return std::unique_ptr<Journal>(new Journal(path, fd));
  }
  ~Journal() { ::close(fd_); }
  Journal(const Journal&) = delete;
  Journal& operator=(const Journal&) = delete;

  // Bytes of the header and the commits.
  int64_t bytes() const { return used_; }
  // False until Adopt (of a clean journal) or Reset, and after any failure:
  // what follows the last commit is then unknown, and only Reset may follow.
  bool usable() const { return usable_; }
  void Abandon() { usable_ = false; }

  // Continues the journal Open replayed; the file is `file_bytes` long.
  void Adopt(const JournalScan& scan, int64_t file_bytes) {
    used_ = scan.used;
    header_bytes_ = scan.header_bytes;
    allocated_ = file_bytes;
    next_seq_ = scan.commits + 1;
    usable_ = !scan.needs_compaction;
  }

  // Empties the journal and starts it for `generation`, whose MANIFEST must
  // already be durable.
  absl::Status Reset(uint64_t generation) {
    usable_ = false;
    // The old header stays until the new one overwrites it: a crash in
    // between leaves a journal of an older generation, which Open ignores.
    if (::ftruncate(fd_, header_bytes_) != 0) {
      return ErrnoToStatus(errno, absl::StrCat("truncate ", path_));
    }
    const std::string header = JournalHeader(generation);
    const int64_t allocated = static_cast<int64_t>(
        RoundUpTo(std::max(header.size(), static_cast<size_t>(header_bytes_)) + 1, static_cast<size_t>(kJournalStep)));
    STRATA_RETURN_IF_ERROR(ZeroFill(fd_, header_bytes_, allocated, path_));
    STRATA_RETURN_IF_ERROR(Sync());
    std::string padded = header;
    if (padded.size() < static_cast<size_t>(header_bytes_)) {
      padded.resize(static_cast<size_t>(header_bytes_), '\0');
    }
    STRATA_RETURN_IF_ERROR(PwriteAll(fd_, padded, 0, path_));
    STRATA_RETURN_IF_ERROR(Sync());
    used_ = static_cast<int64_t>(header.size());
    header_bytes_ = used_;
    allocated_ = allocated;
    next_seq_ = 1;
    usable_ = true;
    return absl::OkStatus();
  }

  // Appends one commit holding `ops` and makes it durable.
  absl::Status Append(const std::vector<JournalOp>& ops) {
    if (!usable_) {
      return absl::FailedPreconditionError(
          absl::StrCat("NVMe store journal ", path_, " needs a reset before appending"));
    }
    std::string body = absl::StrCat(next_seq_);
    for (const JournalOp& op : ops) AppendOp(op, &body);
    const std::string line = ChecksummedLine(body);
    // Unusable until the whole line is known to be durable: a half-written
    // one followed by later commits would read as corruption.
    usable_ = false;
    const int64_t end = used_ + static_cast<int64_t>(line.size());
    STRATA_RETURN_IF_ERROR(PwriteAll(fd_, line, used_, path_));
    if (end > allocated_) {
      const int64_t allocated = static_cast<int64_t>(
          RoundUpTo(static_cast<size_t>(end), static_cast<size_t>(kJournalStep)));
      STRATA_RETURN_IF_ERROR(ZeroFill(fd_, end, allocated, path_));
      allocated_ = allocated;
    }
    STRATA_RETURN_IF_ERROR(Sync());
    used_ = end;
    ++next_seq_;
    usable_ = true;
    return absl::OkStatus();
  }

 private:
  Journal(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  absl::Status Sync() {
    if (::fdatasync(fd_) != 0) return ErrnoToStatus(errno, absl::StrCat("fdatasync ", path_));
    return absl::OkStatus();
  }

  std::string path_;
  int fd_;
  int64_t used_ = 0;
  int64_t header_bytes_ = 0;  // of the header on disk, of whatever generation
  int64_t allocated_ = 0;     // file length; zeros past used_
  uint64_t next_seq_ = 1;
  bool usable_ = false;
};

}  // namespace nvme_store_internal

absl::Status NvmeStoreOptions::Validate() const {
  if (directory.empty()) return absl::InvalidArgumentError("NVMe store directory is empty");
  if (block_size < kAlign || block_size % kAlign != 0 || block_size > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("NVMe store block_size must be a multiple of 4096 in [4096, 1 GiB], got ", block_size));
  }
  if (queue_depth < 1 || queue_depth > 4096) {
    return absl::InvalidArgumentError(absl::StrCat("NVMe store queue_depth must be in [1, 4096], got ", queue_depth));
  }
  if (capacity_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("NVMe store capacity_bytes must be >= 0, got ", capacity_bytes));
  }
  if (max_open_files < 1) {
    return absl::InvalidArgumentError(absl::StrCat("NVMe store max_open_files must be >= 1, got ", max_open_files));
  }
  if (journal_limit_bytes < 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("NVMe store journal_limit_bytes must be >= 4096, got ", journal_limit_bytes));
  }
  return absl::OkStatus();
}

class NvmeStoreImpl final : public NvmeStore {
 public:
  NvmeStoreImpl(const NvmeStoreOptions& options, int lock_fd, bool o_direct);
  ~NvmeStoreImpl() override;
  absl::Status Reserve(const std::string& id, int64_t bytes) override;
  absl::Status Put(const std::string& id, std::span<const std::byte> data) override;
  absl::Status Get(const std::string& id, std::span<std::byte> out) override;
  absl::StatusOr<Ticket> StartWrite(std::span<const NvmeWrite> writes) override;
  absl::StatusOr<Ticket> StartRead(std::span<const NvmeRead> reads) override;
  absl::StatusOr<Ticket> StartWrite(const std::string& id, std::span<const std::byte> data) override;
  absl::StatusOr<Ticket> StartRead(const std::string& id, std::span<std::byte> out) override;
  absl::Status Wait(Ticket ticket) override;
  absl::Status Remove(const std::string& id) override;
  absl::StatusOr<int64_t> Size(const std::string& id) const override;
  bool Contains(const std::string& id) const override;
  std::vector<std::string> Ids() const override;
  absl::Status RegisterBuffers(std::span<const std::span<std::byte>> regions) override;
  int64_t allocated_bytes() const override { return allocated_bytes_; }
  const std::string& directory() const override { return options_.directory; }
  bool o_direct() const override { return o_direct_; }
  const IoEngine& engine() const override { return *engine_; }

 private:
  friend class NvmeStore;  // its factory finishes construction

  using Journal = nvme_store_internal::Journal;
  using JournalOp = nvme_store_internal::JournalOp;

  struct Entry {
    std::string id;
    std::string file;                // name inside the directory
    int64_t size = 0;                // bytes of contents (meaningful when valid)
    int64_t capacity = 0;            // bytes allocated to the slot file
    bool valid = false;              // readable in this process
    bool durable_valid = false;      // the on-disk state may call it valid
    bool name_durable = true;        // the slot file's directory entry is synced
    int64_t recorded_capacity = -1;  // capacity the on-disk state records; -1: unknown
    bool writing = false;
    int readers = 0;
    int fd = -1;
    int fixed_index = -1;  // io_uring fixed-file index, or -1
    uint64_t last_use = 0;
  };
  // One tensor of a batch and the bounce buffer that covers what O_DIRECT
  // cannot take from the caller's memory directly.
  struct Item {
    Entry* entry = nullptr;
    std::byte* caller = nullptr;
    int64_t size = 0;
    AlignedBuffer bounce;
    int64_t bounce_offset = 0;  // where the bounce buffer's bytes go in the tensor
    int64_t bounce_bytes = 0;   // tensor bytes carried by the bounce buffer
    int pending = 0;            // engine transfers outstanding
    absl::Status status;
  };
  struct Batch {
    IoOp op = IoOp::kRead;
    std::vector<Item> items;
    int pending = 0;
  };

  absl::Status Load();
  // Writes MANIFEST generation+1 from memory, then empties JOURNAL for it.
  absl::Status Compact();
  // Makes `ops` durable: one journal commit, or a compaction when the
  // journal is over its bound or unusable after a failure. Memory must
  // already reflect `ops` (a compaction snapshots it).
  absl::Status Commit(const std::vector<JournalOp>& ops);
  std::string PathOf(const Entry& entry) const;
  absl::Status EnsureOpen(Entry& entry);
  void CloseFile(Entry& entry);
  void CloseIdleFiles();
  // Creates `id` (or grows its slot) so it holds at least `bytes`.
  absl::StatusOr<Entry*> Allocate(const std::string& id, int64_t bytes);
  // Queues the engine transfers for one item of `batch`.
  absl::Status SubmitItem(uint64_t batch_id, size_t index, Batch& batch);
  void Dispatch(const IoCompletion& completion);
  absl::Status FinishRead(Batch& batch);
  absl::Status FinishWrite(Batch& batch);

  NvmeStoreOptions options_;
  std::unique_ptr<IoEngine> engine_;
  std::unique_ptr<Journal> journal_;
  uint64_t generation_ = 0;     // of the latest MANIFEST written or read
  int64_t manifest_bytes_ = 0;  // its size
  int lock_fd_ = -1;
  bool o_direct_ = true;
  std::map<std::string, Entry> entries_;  // ordered: MANIFEST is deterministic
  std::unordered_set<std::string> files_in_use_;
  int64_t allocated_bytes_ = 0;
  int open_files_ = 0;
  uint64_t use_clock_ = 0;
  uint64_t next_batch_ = 1;
  std::unordered_map<uint64_t, Batch> batches_;
  std::vector<IoCompletion> completions_;
  bool warned_fallocate_ = false;
};

std::string NvmeStore::SlotFileName(const std::string& id) {
  std::string stem;
  for (const char c : id) {
    if (stem.size() == 64) break;
    const bool keep = absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
    stem += keep ? c : '_';
  }
  // Never a hidden file, never an empty stem.
  if (stem.empty() || stem[0] == '.') stem = absl::StrCat("t", stem);
  return absl::StrCat(stem, "-", Hex64(Fnv1a64(id)), kSlotSuffix);
}

absl::StatusOr<std::unique_ptr<NvmeStore>> NvmeStore::Open(const NvmeStoreOptions& options) {
  STRATA_RETURN_IF_ERROR(options.Validate());
  IoEngineOptions engine_options;
  engine_options.kind = options.engine;
  engine_options.queue_depth = options.queue_depth;
  engine_options.chunk_size = options.block_size;
  STRATA_ASSIGN_OR_RETURN(auto engine, IoEngine::Create(engine_options));
  return Open(options, std::move(engine));
}

absl::StatusOr<std::unique_ptr<NvmeStore>> NvmeStore::Open(const NvmeStoreOptions& options,
                                                           std::unique_ptr<IoEngine> engine) {
  STRATA_RETURN_IF_ERROR(options.Validate());
  if (engine == nullptr) return absl::InvalidArgumentError("NvmeStore needs an I/O engine");
  const std::string& dir = options.directory;
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("NVMe store directory ", dir));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat("NVMe store directory ", dir, " is not a directory"));
  }
  // Checked up front so a read-only mount fails here, naming the directory,
  // rather than at the first Put. (access() honours read-only mounts even
  // for root.)
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("NVMe store directory ", dir, " is not writable"));
  }
  // The LOCK file doubles as the O_DIRECT probe: filesystems without direct
  // I/O (ramfs, some FUSE and overlay setups) refuse the flag at open().
  const std::string lock_path = JoinPath(dir, kLockName);
  bool o_direct = true;
  int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_DIRECT, 0644);
  if (fd < 0 && errno == EINVAL) {
    o_direct = false;
    STRATA_LOG(Warning) << "filesystem of " << dir << " refuses O_DIRECT; NVMe store falls back to buffered I/O";
    fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  }
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("open ", lock_path));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd);
    if (err == EWOULDBLOCK) {
      return absl::FailedPreconditionError(
          absl::StrCat("NVMe store ", dir, " is already open (", lock_path, " is locked)"));
    }
    return ErrnoToStatus(err, absl::StrCat("flock ", lock_path));
  }
  std::unique_ptr<NvmeStoreImpl> store(new NvmeStoreImpl(options, fd, o_direct));
  store->engine_ = std::move(engine);
  STRATA_RETURN_IF_ERROR(store->Load());
  return store;
}

NvmeStoreImpl::NvmeStoreImpl(const NvmeStoreOptions& options, int lock_fd, bool o_direct)
    : options_(options), lock_fd_(lock_fd), o_direct_(o_direct) {}

NvmeStoreImpl::~NvmeStoreImpl() {
  // In-flight transfers target caller buffers and our bounce buffers: finish
  // them before anything is freed. Unwaited writes simply stay invalid.
  while (engine_ != nullptr && engine_->pending() > 0) {
    completions_.clear();
    if (auto status = engine_->Wait(1, &completions_); !status.ok()) {
      STRATA_LOG(Error) << "NVMe store " << options_.directory << ": " << status;
      break;
    }
    for (const IoCompletion& c : completions_) Dispatch(c);
  }
  for (auto& [id, entry] : entries_) CloseFile(entry);
  engine_.reset();
  journal_.reset();
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

std::string NvmeStoreImpl::PathOf(const Entry& entry) const { return JoinPath(options_.directory, entry.file); }

absl::Status NvmeStoreImpl::Load() {
  const std::string& dir = options_.directory;
  std::vector<std::string> slot_files;
  std::vector<std::string> stale_temporaries;
  {
    std::unique_ptr<DIR, int (*)(DIR*)> listing(::opendir(dir.c_str()), &::closedir);
    if (listing == nullptr) return ErrnoToStatus(errno, absl::StrCat("list ", dir));
    while (const dirent* d = ::readdir(listing.get())) {
      const std::string name = d->d_name;
      if (absl::EndsWith(name, kSlotSuffix)) slot_files.push_back(name);
      if (absl::StartsWith(name, kManifestTmpPrefix)) stale_temporaries.push_back(name);
    }
  }
  for (const std::string& name : stale_temporaries) ::unlink(JoinPath(dir, name).c_str());

  const std::string journal_path = JoinPath(dir, kJournalName);
  const bool journal_existed = IsRegularFile(journal_path);
  const std::string manifest_path = JoinPath(dir, kManifestName);
  auto text = ReadFileToString(manifest_path);
  // Checked before the JOURNAL is opened (and so created): a missing one
  // must stay missing, or the next Open would take the new empty file for
  // a fresh journal and lose the records.
  absl::StatusOr<Snapshot> snapshot = absl::NotFoundError("no manifest");
  if (text.ok()) {
    snapshot = ParseManifest(*text, manifest_path);
    if (!snapshot.ok()) return snapshot.status();
    if (snapshot->version == kManifestVersion && !journal_existed) {
      return absl::DataLossError(absl::StrCat("NVMe store journal ", journal_path, " is missing; manifest ",
                                              manifest_path, " (generation ", snapshot->generation, ") needs it"));
    }
  }
  // Created before any MANIFEST that needs it, so the directory sync that
  // makes that MANIFEST durable covers its name too.
  STRATA_ASSIGN_OR_RETURN(auto journal, Journal::Open(journal_path));
  journal_ = std::move(journal);

  if (!text.ok()) {
    if (text.status().code() != absl::StatusCode::kNotFound) return text.status();
    if (!slot_files.empty()) {
      return absl::DataLossError(absl::StrCat("NVMe store ", dir, " holds ", slot_files.size(),
                                              " slot files but no MANIFEST; refusing to guess "
                                              "which are valid"));
    }
    return Compact();  // a fresh store
  }
  generation_ = snapshot->generation;
  manifest_bytes_ = static_cast<int64_t>(text->size());
  std::map<std::string, ManifestRecord> slots;
  for (ManifestRecord& r : snapshot->records) {
    std::string id = r.id;
    slots.emplace(std::move(id), std::move(r));
  }

  JournalScan scan;
  if (snapshot->version != kManifestVersion) {
    // Version 1 kept no journal; the compaction below rewrites it as this one.
    STRATA_LOG(Info) << "upgrading NVMe store manifest " << manifest_path << " from format version "
                     << snapshot->version;
    scan.needs_compaction = true;
  } else {
    STRATA_ASSIGN_OR_RETURN(auto journal_text, ReadFileToString(journal_path));
    STRATA_ASSIGN_OR_RETURN(auto replayed, ReplayJournal(journal_text, journal_path, generation_, slots));
    scan = replayed;
    journal_->Adopt(scan, static_cast<int64_t>(journal_text.size()));
  }

  bool compact = scan.needs_compaction;
  for (auto& [id, r] : slots) {
    Entry entry;
    entry.id = id;
    entry.file = std::move(r.file);
    entry.size = r.size;
    entry.capacity = r.capacity;
    entry.recorded_capacity = r.capacity;
    entry.valid = r.valid;
    const std::string path = PathOf(entry);
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) {
      if (entry.valid) {
        return absl::DataLossError(absl::StrCat("slot file ", path, " of tensor '", entry.id, "' is missing"));
      }
      STRATA_LOG(Warning) << "dropping reservation for '" << entry.id << "': " << path << " is missing";
      compact = true;
      continue;
    }
    const int64_t on_disk = static_cast<int64_t>(st.st_size) / kAlign * kAlign;
    if (entry.valid && on_disk < PadToAlign(entry.size)) {
      return absl::DataLossError(absl::StrCat("slot file ", path, " of tensor '", entry.id,
                                              "' is truncated: ", st.st_size, " bytes, need ", PadToAlign(entry.size)));
    }
    // A crash after growing a slot but before recording it leaves it larger.
    entry.capacity = on_disk;
    entry.durable_valid = entry.valid;
    allocated_bytes_ += entry.capacity;
    files_in_use_.insert(entry.file);
    entries_.emplace(id, std::move(entry));
  }
  for (const std::string& name : slot_files) {
    if (files_in_use_.count(name) > 0) continue;
    // Created by a write that never got recorded, or recorded as removed
    // just before a crash.
    STRATA_LOG(Info) << "removing orphaned slot file " << JoinPath(dir, name);
    ::unlink(JoinPath(dir, name).c_str());
  }
  // Folding the journal in now keeps it from growing across restarts, and
  // any torn tail from being followed by new commits.
  return compact ? Compact() : absl::OkStatus();
}

absl::Status NvmeStoreImpl::Compact() {
  // A fresh number even if this attempt fails part way: the journal on disk
  // then names an older generation than any MANIFEST this may have left.
  ++generation_;
  std::string text = absl::StrCat(kManifestMagic, " ", kManifestVersion, " ", generation_, "\n");
  for (const auto& [id, e] : entries_) {
    absl::StrAppend(&text, "slot ", e.valid ? 1 : 0, " ", e.size, " ", e.capacity, " ", e.file, " ", absl::CEscape(id),
                    "\n");
  }
  absl::StrAppend(&text, "end ", entries_.size(), " ", Hex64(Fnv1a64(text)), "\n");
  const std::string& dir = options_.directory;
  // WriteFileAtomically syncs the directory after its rename, which makes
  // every slot file's name there durable too.
  absl::Status status = WriteFileAtomically(JoinPath(dir, kManifestName), text);
  if (!status.ok()) {
    journal_->Abandon();
    return status;
  }
  manifest_bytes_ = static_cast<int64_t>(text.size());
  for (auto& [id, e] : entries_) {
    e.durable_valid = e.valid;
    e.recorded_capacity = e.capacity;
    e.name_durable = true;
  }
  return journal_->Reset(generation_);
}

absl::Status NvmeStoreImpl::Commit(const std::vector<JournalOp>& ops) {
  if (ops.empty()) return absl::OkStatus();
  const int64_t limit = std::max(options_.journal_limit_bytes, manifest_bytes_);
  if (journal_->usable() && journal_->bytes() < limit) return journal_->Append(ops);
  // The snapshot is taken from memory, which already holds what `ops` says.
  return Compact();
}

absl::Status NvmeStoreImpl::EnsureOpen(Entry& entry) {
  entry.last_use = ++use_clock_;
  if (entry.fd >= 0) return absl::OkStatus();
  const std::string path = PathOf(entry);
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | (o_direct_ ? O_DIRECT : 0));
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("open ", path));
  entry.fd = fd;
  ++open_files_;
  // A full fixed-file table only costs a per-I/O file lookup.
  auto index = engine_->RegisterFile(fd);
  entry.fixed_index = index.ok() ? *index : -1;
  CloseIdleFiles();
  return absl::OkStatus();
}

void NvmeStoreImpl::CloseFile(Entry& entry) {
  if (entry.fd < 0) return;
  if (entry.fixed_index >= 0) {
    // The ring holds its own reference; drop it before the descriptor.
    if (auto status = engine_->UnregisterFile(entry.fixed_index); !status.ok()) {
      STRATA_LOG(Warning) << "unregister " << PathOf(entry) << ": " << status;
    }
    entry.fixed_index = -1;
  }
  ::close(entry.fd);
  entry.fd = -1;
  --open_files_;
}

void NvmeStoreImpl::CloseIdleFiles() {
  if (open_files_ <= options_.max_open_files) return;
  std::vector<Entry*> idle;
  for (auto& [id, e] : entries_) {
    if (e.fd >= 0 && !e.writing && e.readers == 0 && e.last_use != use_clock_) idle.push_back(&e);
  }
  std::sort(idle.begin(), idle.end(), [](const Entry* a, const Entry* b) { return a->last_use < b->last_use; });
  for (Entry* e : idle) {
    if (open_files_ <= options_.max_open_files) break;
    CloseFile(*e);
  }
}

absl::StatusOr<NvmeStoreImpl::Entry*> NvmeStoreImpl::Allocate(const std::string& id, int64_t bytes) {
  const int64_t want = PadToAlign(bytes);
  auto it = entries_.find(id);
  const bool created = it == entries_.end();
  if (created) {
    Entry entry;
    entry.id = id;
    entry.file = SlotFileName(id);
    entry.name_durable = false;
    // Ids that sanitise alike and collide in 64 bits still get distinct files.
    const std::string stem = entry.file.substr(0, entry.file.size() - std::strlen(kSlotSuffix));
    for (int n = 2; files_in_use_.count(entry.file) > 0; ++n) {
      entry.file = absl::StrCat(stem, "-", n, kSlotSuffix);
    }
    it = entries_.emplace(id, std::move(entry)).first;
    files_in_use_.insert(it->second.file);
  }
  Entry& e = it->second;
  const std::string path = PathOf(e);
  // Undoes a slot created by this call; an existing one keeps its space.
  auto fail = [&](absl::Status status) -> absl::Status {
    if (created) {
      CloseFile(e);
      ::unlink(path.c_str());
      files_in_use_.erase(e.file);
      entries_.erase(it);
    }
    return status;
  };
  if (created) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | (o_direct_ ? O_DIRECT : 0), 0644);
    if (fd < 0) return fail(ErrnoToStatus(errno, absl::StrCat("create ", path)));
    e.fd = fd;
    ++open_files_;
    auto index = engine_->RegisterFile(fd);
    e.fixed_index = index.ok() ? *index : -1;
    e.last_use = ++use_clock_;
    CloseIdleFiles();
  }
  if (auto status = EnsureOpen(e); !status.ok()) return fail(status);
  if (want <= e.capacity) return &e;
  const int64_t grow = want - e.capacity;
  if (options_.capacity_bytes > 0 && allocated_bytes_ + grow > options_.capacity_bytes) {
    return fail(absl::ResourceExhaustedError(
        absl::StrCat("NVMe store ", options_.directory, " capacity of ", options_.capacity_bytes,
                     " bytes exceeded: tensor '", id, "' needs ", grow, " more (", allocated_bytes_, " allocated)")));
  }
  // Real blocks now, so a full disk shows up here as ENOSPC and not in the
  // middle of a write, and the data path never allocates.
  if (::fallocate(e.fd, 0, 0, want) != 0) {
    const int err = errno;
    if (err != EOPNOTSUPP) {
      return fail(ErrnoToStatus(err, absl::StrCat("preallocate ", want, " bytes for tensor '", id, "' in ", path)));
    }
    if (!warned_fallocate_) {
      STRATA_LOG(Warning) << "filesystem of " << options_.directory << " lacks fallocate; slot files are sparse";
      warned_fallocate_ = true;
    }
    if (::ftruncate(e.fd, want) != 0) {
      return fail(ErrnoToStatus(errno, absl::StrCat("resize ", path, " to ", want, " bytes")));
    }
  }
  allocated_bytes_ += grow;
  e.capacity = want;
  return &e;
}

absl::Status NvmeStoreImpl::Reserve(const std::string& id, int64_t bytes) {
  if (bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", id, "': negative size ", bytes));
  }
  auto it = entries_.find(id);
  if (it != entries_.end() && it->second.writing) {
    return absl::FailedPreconditionError(absl::StrCat("tensor '", id, "': cannot reserve while a write is in flight"));
  }
  STRATA_ASSIGN_OR_RETURN(auto entry, Allocate(id, bytes));
  Entry& e = *entry;
  if (e.recorded_capacity == e.capacity) return absl::OkStatus();
  // Recorded only with its name durable, or a crash could leave a record
  // without a file.
  if (!e.name_durable) {
    STRATA_RETURN_IF_ERROR(SyncDirectory(options_.directory));
    e.name_durable = true;
  }
  e.recorded_capacity = -1;  // unknown should the commit fail
  if (auto status = Commit({JournalOp{JournalOp::Kind::kSlot, e.id, e.file, e.capacity, 0}}); !status.ok()) {
    return status;
  }
  e.recorded_capacity = e.capacity;
  return absl::OkStatus();
}

absl::Status NvmeStoreImpl::SubmitItem(uint64_t batch_id, size_t index, Batch& batch) {
  Item& item = batch.items[index];
  const Entry& e = *item.entry;
  if (item.size == 0) return absl::OkStatus();
  // O_DIRECT moves whole 4096-byte blocks to and from 4096-aligned memory.
  // The aligned bulk of the caller's buffer is used in place; the ragged tail
  // (or all of an unaligned buffer) goes through a zero-padded bounce buffer.
  const bool aligned = reinterpret_cast<uintptr_t>(item.caller) % kDirectIoAlignment == 0;
  const int64_t direct = aligned ? item.size / kAlign * kAlign : 0;
  IoRequest base;
  base.op = batch.op;
  base.file = e.fixed_index >= 0 ? e.fixed_index : e.fd;
  base.fixed_file = e.fixed_index >= 0;
  base.tag = (batch_id << kItemBits) | index;
  base.path = PathOf(e);
  std::vector<IoRequest> requests;
  if (direct > 0) {
    IoRequest r = base;
    r.offset = 0;
    r.buffer = item.caller;
    r.length = direct;
    requests.push_back(std::move(r));
  }
  if (direct < item.size) {
    const int64_t rest = item.size - direct;
    const int64_t padded = PadToAlign(rest);
    auto bounce = AlignedBuffer::Allocate(static_cast<size_t>(padded));
    if (!bounce.ok()) return bounce.status();
    item.bounce = *std::move(bounce);
    item.bounce_offset = direct;
    item.bounce_bytes = rest;
    if (batch.op == IoOp::kWrite) {
      std::memcpy(item.bounce.data(), item.caller + direct, static_cast<size_t>(rest));
      std::memset(item.bounce.data() + rest, 0, static_cast<size_t>(padded - rest));
    }
    IoRequest r = base;
    r.offset = direct;
    r.buffer = item.bounce.data();
    r.length = padded;
    requests.push_back(std::move(r));
  }
  STRATA_RETURN_IF_ERROR(engine_->Submit(requests));
  item.pending += static_cast<int>(requests.size());
  batch.pending += static_cast<int>(requests.size());
  return absl::OkStatus();
}

absl::StatusOr<NvmeStoreImpl::Ticket> NvmeStoreImpl::StartWrite(std::span<const NvmeWrite> writes) {
  if (writes.size() > kItemMask) return absl::InvalidArgumentError("write batch too large");
  std::unordered_set<std::string> seen;
  for (const NvmeWrite& w : writes) {
    if (!seen.insert(w.id).second) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", w.id, "' twice in one batch"));
    }
    if (!w.data.empty() && w.data.data() == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", w.id, "': null data"));
    }
    auto it = entries_.find(w.id);
    if (it != entries_.end() && (it->second.writing || it->second.readers > 0)) {
      return absl::FailedPreconditionError(
          absl::StrCat("tensor '", w.id, "' has I/O in flight; wait for it before writing"));
    }
  }
  Batch batch;
  batch.op = IoOp::kWrite;
  batch.items.reserve(writes.size());
  auto unwind = [&batch] {
    for (Item& item : batch.items) item.entry->writing = false;
  };
  for (const NvmeWrite& w : writes) {
    auto entry = Allocate(w.id, static_cast<int64_t>(w.data.size()));
    if (!entry.ok()) {
      // A failed write leaves no readable value (see the header).
      auto it = entries_.find(w.id);
      if (it != entries_.end()) it->second.valid = false;
      unwind();
      return entry.status();
    }
    Item item;
    item.entry = *entry;
    item.caller = const_cast<std::byte*>(w.data.data());
    item.size = static_cast<int64_t>(w.data.size());
    item.entry->writing = true;
    batch.items.push_back(std::move(item));
  }
  // Before any byte of a durable slot is overwritten, the on-disk state must
  // stop calling it valid: one journal commit covers the whole batch.
  std::vector<JournalOp> invalidations;
  for (Item& item : batch.items) {
    Entry& e = *item.entry;
    e.valid = false;
    if (e.durable_valid) invalidations.push_back({JournalOp::Kind::kInvalid, e.id, "", 0, 0});
  }
  if (auto status = Commit(invalidations); !status.ok()) {
    unwind();  // durable_valid stays: the invalidation may not have landed
    return status;
  }
  for (Item& item : batch.items) item.entry->durable_valid = false;
  const uint64_t batch_id = next_batch_++;
  Batch& stored = batches_[batch_id] = std::move(batch);
  for (size_t i = 0; i < stored.items.size(); ++i) {
    // Reported by Wait: other items of the batch are already under way.
    if (auto status = SubmitItem(batch_id, i, stored); !status.ok()) stored.items[i].status = status;
  }
  return batch_id;
}

absl::StatusOr<NvmeStoreImpl::Ticket> NvmeStoreImpl::StartRead(std::span<const NvmeRead> reads) {
  if (reads.size() > kItemMask) return absl::InvalidArgumentError("read batch too large");
  for (const NvmeRead& r : reads) {
    auto it = entries_.find(r.id);
    if (it == entries_.end() || !it->second.valid) {
      if (it != entries_.end() && it->second.writing) {
        return absl::FailedPreconditionError(
            absl::StrCat("tensor '", r.id, "' is being written; wait for it before reading"));
      }
      return absl::NotFoundError(
          absl::StrCat("tensor '", r.id, "' has no valid data in NVMe store ", options_.directory));
    }
    if (static_cast<int64_t>(r.out.size()) != it->second.size) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", r.id, "' is ", it->second.size, " bytes; read buffer is ", r.out.size()));
    }
    if (!r.out.empty() && r.out.data() == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", r.id, "': null buffer"));
    }
  }
  Batch batch;
  batch.op = IoOp::kRead;
  batch.items.reserve(reads.size());
  for (const NvmeRead& r : reads) {
    Entry& e = entries_.at(r.id);
    ++e.readers;
    Item item;
    item.entry = &e;
    item.caller = r.out.data();
    item.size = static_cast<int64_t>(r.out.size());
    batch.items.push_back(std::move(item));
    if (auto status = EnsureOpen(e); !status.ok()) {
      for (Item& done : batch.items) --done.entry->readers;
      return ForTensor(r.id, status);
    }
  }
  const uint64_t batch_id = next_batch_++;
  Batch& stored = batches_[batch_id] = std::move(batch);
  for (size_t i = 0; i < stored.items.size(); ++i) {
    if (auto status = SubmitItem(batch_id, i, stored); !status.ok()) stored.items[i].status = status;
  }
  return batch_id;
}

absl::StatusOr<NvmeStoreImpl::Ticket> NvmeStoreImpl::StartWrite(const std::string& id,
                                                                std::span<const std::byte> data) {
  const NvmeWrite write{id, data};
  return StartWrite(std::span<const NvmeWrite>(&write, 1));
}

absl::StatusOr<NvmeStoreImpl::Ticket> NvmeStoreImpl::StartRead(const std::string& id, std::span<std::byte> out) {
  const NvmeRead read{id, out};
  return StartRead(std::span<const NvmeRead>(&read, 1));
}

void NvmeStoreImpl::Dispatch(const IoCompletion& completion) {
  auto it = batches_.find(completion.tag >> kItemBits);
  if (it == batches_.end()) return;
  Batch& batch = it->second;
  Item& item = batch.items[completion.tag & kItemMask];
  if (!completion.status.ok() && item.status.ok()) item.status = completion.status;
  --item.pending;
  --batch.pending;
}

absl::Status NvmeStoreImpl::Wait(Ticket ticket) {
  auto it = batches_.find(ticket);
  if (it == batches_.end()) {
    return absl::InvalidArgumentError(absl::StrCat("unknown NVMe store ticket ", ticket));
  }
  while (it->second.pending > 0) {
    completions_.clear();
    STRATA_RETURN_IF_ERROR(engine_->Wait(1, &completions_));
    for (const IoCompletion& c : completions_) Dispatch(c);
  }
  Batch batch = std::move(it->second);
  batches_.erase(it);
  return batch.op == IoOp::kRead ? FinishRead(batch) : FinishWrite(batch);
}

absl::Status NvmeStoreImpl::FinishRead(Batch& batch) {
  absl::Status first;
  for (Item& item : batch.items) {
    --item.entry->readers;
    if (!item.status.ok()) {
      if (first.ok()) first = ForTensor(item.entry->id, item.status);
      continue;
    }
    if (item.bounce_bytes > 0) {
      std::memcpy(item.caller + item.bounce_offset, item.bounce.data(), static_cast<size_t>(item.bounce_bytes));
    }
  }
  return first;
}

absl::Status NvmeStoreImpl::FinishWrite(Batch& batch) {
  absl::Status first;
  std::vector<Entry*> written;
  bool names_durable = true;
  for (Item& item : batch.items) {
    Entry& e = *item.entry;
    e.writing = false;
    // Data (and the extent conversion of freshly fallocated blocks) must be on
    // stable storage before the journal may call the slot valid.
    if (item.status.ok() && item.size > 0 && ::fdatasync(e.fd) != 0) {
      item.status = ErrnoToStatus(errno, absl::StrCat("fdatasync ", PathOf(e)));
    }
    if (!item.status.ok()) {
      e.valid = false;
      if (first.ok()) first = ForTensor(e.id, item.status);
      continue;
    }
    e.size = item.size;
    e.valid = true;
    names_durable &= e.name_durable;
    written.push_back(&e);
  }
  if (written.empty()) return first;
  absl::Status status;
  // A new slot file's name must be durable before a record may call it valid.
  if (!names_durable) {
    status = SyncDirectory(options_.directory);
    for (Entry* e : written) e->name_durable |= status.ok();
  }
  std::vector<JournalOp> ops;
  for (const Entry* e : written) {
    if (e->recorded_capacity != e->capacity) {
      ops.push_back({JournalOp::Kind::kSlot, e->id, e->file, e->capacity, 0});
    }
    ops.push_back({JournalOp::Kind::kValid, e->id, "", 0, e->size});
  }
  if (status.ok()) status = Commit(ops);
  if (!status.ok()) {
    // Not known to be recorded, so not valid here; but the commit may have
    // landed, so a later overwrite must invalidate first.
    for (Entry* e : written) {
      e->valid = false;
      e->durable_valid = true;
      e->recorded_capacity = -1;
    }
    return status;
  }
  for (Entry* e : written) {
    e->durable_valid = true;
    e->recorded_capacity = e->capacity;
  }
  return first;
}

absl::Status NvmeStoreImpl::Put(const std::string& id, std::span<const std::byte> data) {
  STRATA_ASSIGN_OR_RETURN(auto ticket, StartWrite(id, data));
  return Wait(ticket);
}

absl::Status NvmeStoreImpl::Get(const std::string& id, std::span<std::byte> out) {
  STRATA_ASSIGN_OR_RETURN(auto ticket, StartRead(id, out));
  return Wait(ticket);
}

absl::Status NvmeStoreImpl::Remove(const std::string& id) {
  auto it = entries_.find(id);
  if (it == entries_.end()) {
    return absl::NotFoundError(absl::StrCat("tensor '", id, "' not in NVMe store ", options_.directory));
  }
  Entry& e = it->second;
  if (e.writing || e.readers > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("tensor '", id, "' has I/O in flight; wait for it before removing"));
  }
  const std::string path = PathOf(e);
  CloseFile(e);
  Entry removed = std::move(e);
  allocated_bytes_ -= removed.capacity;
  files_in_use_.erase(removed.file);
  entries_.erase(it);
  // The record first: a crash in between leaves an orphan that Open deletes,
  // never a record pointing at a missing file. Written even for a slot the
  // disk may not know: replaying it is harmless, skipping it might not be.
  if (auto status = Commit({JournalOp{JournalOp::Kind::kRemove, id, "", 0, 0}}); !status.ok()) {
    // The disk may still record the slot, so keep it, unreadable: a later
    // write then invalidates it before overwriting, a later Remove retries.
    removed.valid = false;
    allocated_bytes_ += removed.capacity;
    files_in_use_.insert(removed.file);
    entries_.emplace(id, std::move(removed));
    return status;
  }
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return ErrnoToStatus(errno, absl::StrCat("remove ", path));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> NvmeStoreImpl::Size(const std::string& id) const {
  auto it = entries_.find(id);
  if (it == entries_.end() || !it->second.valid) {
    return absl::NotFoundError(absl::StrCat("tensor '", id, "' has no valid data in NVMe store ", options_.directory));
  }
  return it->second.size;
}

bool NvmeStoreImpl::Contains(const std::string& id) const {
  auto it = entries_.find(id);
  return it != entries_.end() && it->second.valid;
}

std::vector<std::string> NvmeStoreImpl::Ids() const {
  std::vector<std::string> ids;
  for (const auto& [id, e] : entries_) {
    if (e.valid) ids.push_back(id);
  }
  return ids;
}

absl::Status NvmeStoreImpl::RegisterBuffers(std::span<const std::span<std::byte>> regions) {
  return engine_->RegisterBuffers(regions);
}

namespace {

class SynchronizedStore final : public NvmeStore {
 public:
  explicit SynchronizedStore(std::unique_ptr<NvmeStore> store) : store_(std::move(store)) {}
  absl::Status Reserve(const std::string& id, int64_t bytes) override {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    return store_->Reserve(id, bytes);
  }
  absl::Status Put(const std::string& id, std::span<const std::byte> data) override {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    return store_->Put(id, data);
  }
  absl::Status Get(const std::string& id, std::span<std::byte> out) override {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    return store_->Get(id, out);
  }
  absl::StatusOr<Ticket> StartWrite(std::span<const NvmeWrite> writes) override {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    return store_->StartWrite(writes);
  }
  absl::StatusOr<Ticket> StartRead(std::span<const NvmeRead> reads) override {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    return store_->StartRead(reads);
  }
  absl::StatusOr<Ticket> StartWrite(const std::string& id, std::span<const std::byte> data) override {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    return store_->StartWrite(id, data);
  }
  absl::StatusOr<Ticket> StartRead(const std::string& id, std::span<std::byte> out) override {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    return store_->StartRead(id, out);
  }
  absl::Status Wait(Ticket ticket) override {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    return store_->Wait(ticket);
  }
  absl::Status Remove(const std::string& id) override {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    return store_->Remove(id);
  }
  absl::StatusOr<int64_t> Size(const std::string& id) const override {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    return store_->Size(id);
  }
  bool Contains(const std::string& id) const override {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    return store_->Contains(id);
  }
  std::vector<std::string> Ids() const override {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    return store_->Ids();
  }
  int64_t allocated_bytes() const override {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    return store_->allocated_bytes();
  }
  absl::Status RegisterBuffers(std::span<const std::span<std::byte>> regions) override {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    return store_->RegisterBuffers(regions);
  }
  const std::string& directory() const override { return store_->directory(); }
  bool o_direct() const override { return store_->o_direct(); }
  const IoEngine& engine() const override { return store_->engine(); }

 private:
  mutable std::recursive_mutex mu_;
  const std::unique_ptr<NvmeStore> store_;
};

}  // namespace

std::unique_ptr<NvmeStore> SynchronizedNvmeStore(std::unique_ptr<NvmeStore> store) {
  return std::make_unique<SynchronizedStore>(std::move(store));
}

}  // namespace strata::offload
