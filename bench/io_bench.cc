#include "bench/io_bench.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/file.h"
#include "base/status_macros.h"
#include "base/subprocess.h"
#include "bench/stats.h"
#include "offload/nvme/aligned_buffer.h"
#include "offload/nvme/io_engine.h"
#include "offload/nvme/nvme_store.h"

namespace strata::bench {

namespace {

// Removes the benchmark's working directory however RunIoBench returns.
class ScopedDirectory {
 public:
  explicit ScopedDirectory(std::string path) : path_(std::move(path)) {}
  ~ScopedDirectory() { RemoveTree(path_); }
  ScopedDirectory(const ScopedDirectory&) = delete;
  ScopedDirectory& operator=(const ScopedDirectory&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void FillPattern(std::span<std::byte> bytes) {
  uint64_t x = 0x9e3779b97f4a7c15ull;
  const size_t words = bytes.size() / sizeof(uint64_t);
  auto* out = reinterpret_cast<uint64_t*>(bytes.data());
  for (size_t i = 0; i < words; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    out[i] = x;
  }
}

uint64_t Checksum(std::span<const std::byte> bytes) {
  const size_t words = bytes.size() / sizeof(uint64_t);
  const auto* in = reinterpret_cast<const uint64_t*>(bytes.data());
  uint64_t sum = 0;
  for (size_t i = 0; i < words; ++i) sum = (sum ^ in[i]) * 0x100000001b3ull + i;
  return sum;
}

double MegabytesPerSecond(int64_t bytes, double seconds) {
  return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e6 : 0.0;
}

// Best and every run of one side, in MB/s.
struct Rates {
  double write_mbps = 0;
  double read_mbps = 0;
  std::vector<double> write_runs;
  std::vector<double> read_runs;

  void Add(double write, double read) {
    write_mbps = std::max(write_mbps, write);
    read_mbps = std::max(read_mbps, read);
    write_runs.push_back(write);
    read_runs.push_back(read);
  }
};

double Ratio(double ours, double peer) { return peer > 0 ? ours / peer : 0; }

std::string Spread(const std::vector<double>& runs) {
  if (runs.empty()) return "";
  const auto [lo, hi] = std::minmax_element(runs.begin(), runs.end());
  return absl::StrFormat("%.0f-%.0f", *lo, *hi);
}

// Our side of one repetition: a fresh NvmeStore holding one tensor of the
// benchmark size, written from and read back into `data`.
class OursRun {
 public:
  static absl::StatusOr<std::unique_ptr<OursRun>> Create(const IoBenchRequest& r, const std::string& dir,
                                                         offload::AlignedBuffer& data) {
    STRATA_ASSIGN_OR_RETURN(auto kind, offload::ParseIoEngineKind(r.engine));
    offload::NvmeStoreOptions options;
    options.directory = dir;
    options.block_size = r.block_kib * 1024;
    options.queue_depth = r.queue_depth;
    options.engine = kind;
    STRATA_ASSIGN_OR_RETURN(auto store, offload::NvmeStore::Open(options));
    const std::span<std::byte> region = data.span();
    // The host arena will be registered the same way; fio gets fixedbufs.
    STRATA_RETURN_IF_ERROR(store->RegisterBuffers({&region, 1}));
    // Preallocated before the clock starts, as fio lays out its file first.
    if (auto status = store->Reserve(kId, static_cast<int64_t>(data.size())); !status.ok()) {
      return status;
    }
    return std::unique_ptr<OursRun>(new OursRun(std::move(store), data));
  }

  // Writes the slot once, untimed, so the timed pass overwrites blocks that
  // are already allocated, as fio's second pass does.
  absl::Status Prefill() { return store_->Put(kId, data_.span()); }

  // Returns MB/s; includes everything a durable overwrite costs: the
  // journal commit that invalidates the old contents, the data, fdatasync,
  // and the journal commit that validates the new contents.
  absl::StatusOr<double> Write() {
    expected_ = Checksum(data_.span());
    const auto start = std::chrono::steady_clock::now();
    STRATA_RETURN_IF_ERROR(store_->Put(kId, data_.span()));
    return MegabytesPerSecond(static_cast<int64_t>(data_.size()), SecondsSince(start));
  }

  absl::StatusOr<double> Read() {
    std::memset(data_.data(), 0, data_.size());  // a read that did nothing must not pass
    const auto start = std::chrono::steady_clock::now();
    STRATA_RETURN_IF_ERROR(store_->Get(kId, data_.span()));
    const double seconds = SecondsSince(start);
    if (Checksum(data_.span()) != expected_) {
      return absl::InternalError(absl::StrCat("NVMe store in ", store_->directory(), " read back different bytes"));
    }
    return MegabytesPerSecond(static_cast<int64_t>(data_.size()), seconds);
  }

  std::string engine() const { return store_->engine().backend_name(); }
  bool o_direct() const { return store_->o_direct(); }

 private:
  static constexpr char kId[] = "bench/io";
  OursRun(std::unique_ptr<offload::NvmeStore> store, offload::AlignedBuffer& data)
      : store_(std::move(store)), data_(data) {}
  static double SecondsSince(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  std::unique_ptr<offload::NvmeStore> store_;
  offload::AlignedBuffer& data_;
  uint64_t expected_ = 0;
};

// One fio job over `file`; returns its bandwidth in MB/s.
absl::StatusOr<double> RunFioJob(const IoBenchRequest& r, const std::string& file, bool write,
                                 const std::string& scratch_dir, std::string* version) {
  const int64_t bytes = r.size_mib << 20;
  std::vector<std::string> argv = {
      r.fio,
      absl::StrCat("--name=strata-bench-", write ? "write" : "read"),
      absl::StrCat("--filename=", file),
      absl::StrCat("--size=", bytes),
      absl::StrCat("--bs=", r.block_kib * 1024),
      absl::StrCat("--iodepth=", r.queue_depth),
      "--ioengine=io_uring",
      "--direct=1",
      "--registerfiles=1",
      "--fixedbufs=1",
      "--fallocate=native",
      absl::StrCat("--rw=", write ? "write" : "read"),
      "--output-format=json",
  };
  if (write) argv.push_back("--end_fsync=1");
  STRATA_ASSIGN_OR_RETURN(auto run, RunProcess(argv, scratch_dir));
  if (run.exit_code != 0) {
    return absl::InternalError(absl::StrCat(r.fio, " exited with ", run.exit_code, ": ", run.error));
  }
  // fio may print warnings ahead of the JSON document.
  const size_t brace = run.output.find('{');
  if (brace == std::string::npos) {
    return absl::InternalError(absl::StrCat("fio printed no JSON: ", run.output, run.error));
  }
  const nlohmann::json report = nlohmann::json::parse(run.output.begin() + static_cast<std::ptrdiff_t>(brace),
                                                      run.output.end(), nullptr, /*allow_exceptions=*/false);
  if (report.is_discarded() || !report.contains("jobs") || report["jobs"].empty()) {
    return absl::InternalError(absl::StrCat("cannot parse fio's JSON output: ", run.output));
  }
  const nlohmann::json& job = report["jobs"][0];
  if (job.value("error", 0) != 0) {
    return absl::InternalError(absl::StrCat("fio job failed with error ", job.value("error", 0), ": ", run.error));
  }
  const char* direction = write ? "write" : "read";
  if (!job.contains(direction) || !job[direction].contains("bw_bytes")) {
    return absl::InternalError(absl::StrCat("fio's JSON has no ", direction, ".bw_bytes"));
  }
  if (version != nullptr) *version = report.value("fio version", "");
  // bw_bytes is bytes per second.
  return job[direction]["bw_bytes"].get<double>() / 1e6;
}

absl::Status Validate(const IoBenchRequest& r) {
  if (r.size_mib < 1 || r.size_mib > (int64_t{1} << 20)) {
    return absl::InvalidArgumentError(absl::StrCat("--size-mib must be in [1, 2^20], got ", r.size_mib));
  }
  if (r.block_kib < 4 || r.block_kib % 4 != 0 || r.block_kib > (1 << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--block-kib must be a multiple of 4 in [4, 1048576], got ", r.block_kib));
  }
  if ((r.size_mib * 1024) % r.block_kib != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--size-mib (", r.size_mib, " MiB) must be a multiple of --block-kib (", r.block_kib, " KiB)"));
  }
  if (r.queue_depth < 1 || r.queue_depth > 4096) {
    return absl::InvalidArgumentError(absl::StrCat("--queue-depth must be in [1, 4096], got ", r.queue_depth));
  }
  if (r.repeats < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--repeats must be >= 1, got ", r.repeats));
  }
  if (!IsDirectory(r.dir)) {
    return absl::NotFoundError(absl::StrCat("benchmark directory ", r.dir, " does not exist"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> RunIoBench(const IoBenchRequest& r) {
  STRATA_RETURN_IF_ERROR(Validate(r));
  const ScopedDirectory work(JoinPath(r.dir, absl::StrCat("strata-io-bench-", ::getpid())));
  if (::mkdir(work.path().c_str(), 0755) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("create ", work.path()));
  }
  STRATA_ASSIGN_OR_RETURN(auto data, offload::AlignedBuffer::Allocate(static_cast<size_t>(r.size_mib << 20)));
  FillPattern(data.span());

  Rates ours;
  Rates fio;
  std::string engine;
  bool o_direct = false;
  std::string fio_version;
  const std::string fio_file = JoinPath(work.path(), "fio.dat");
  for (int i = 0; i < r.repeats; ++i) {
    // Each side runs prefill, timed overwrite, timed read back to back, so
    // each reads what it has just written; the side that goes first
    // alternates, so drift in the device (and in the CPU a shared VM gets)
    // does not always favour the same one. The best repetition counts.
    const bool fio_first = i % 2 == 1;
    for (int turn = 0; turn < 2; ++turn) {
      if ((turn == 0) == fio_first) {
        if (auto prefill = RunFioJob(r, fio_file, /*write=*/true, work.path(), &fio_version); !prefill.ok()) {
          return prefill.status();
        }
        STRATA_ASSIGN_OR_RETURN(auto write, RunFioJob(r, fio_file, /*write=*/true, work.path(), &fio_version));
        STRATA_ASSIGN_OR_RETURN(auto read, RunFioJob(r, fio_file, /*write=*/false, work.path(), &fio_version));
        fio.Add(write, read);
        ::unlink(fio_file.c_str());
        continue;
      }
      const std::string store_dir = JoinPath(work.path(), absl::StrCat("ours-", i));
      if (::mkdir(store_dir.c_str(), 0755) != 0) {
        return ErrnoToStatus(errno, absl::StrCat("create ", store_dir));
      }
      STRATA_ASSIGN_OR_RETURN(auto run, OursRun::Create(r, store_dir, data));
      engine = run->engine();
      o_direct = run->o_direct();
      STRATA_RETURN_IF_ERROR(run->Prefill());
      STRATA_ASSIGN_OR_RETURN(auto write, run->Write());
      STRATA_ASSIGN_OR_RETURN(auto read, run->Read());
      ours.Add(write, read);
      run.reset();
      RemoveTree(store_dir);
    }
  }
  const double write_ratio = Ratio(ours.write_mbps, fio.write_mbps);
  const double read_ratio = Ratio(ours.read_mbps, fio.read_mbps);
  // Medians too: on a shared VM disk single runs of either side swing 2x.
  const double write_ratio_median = Ratio(Median(ours.write_runs), Median(fio.write_runs));
  const double read_ratio_median = Ratio(Median(ours.read_runs), Median(fio.read_runs));

  if (r.json) {
    nlohmann::json out = {
        {"ours_write_mbps", ours.write_mbps},
        {"ours_read_mbps", ours.read_mbps},
        {"fio_write_mbps", fio.write_mbps},
        {"fio_read_mbps", fio.read_mbps},
        {"write_ratio", write_ratio},
        {"read_ratio", read_ratio},
        {"write_ratio_median", write_ratio_median},
        {"read_ratio_median", read_ratio_median},
        {"engine", engine},
        {"o_direct", o_direct},
        {"size_mib", r.size_mib},
        {"block_kib", r.block_kib},
        {"queue_depth", r.queue_depth},
        {"repeats", r.repeats},
        {"fio_version", fio_version},
        {"ours_write_mbps_runs", ours.write_runs},
        {"ours_read_mbps_runs", ours.read_runs},
        {"fio_write_mbps_runs", fio.write_runs},
        {"fio_read_mbps_runs", fio.read_runs},
        {"mb", "1e6 bytes"},
    };
    return out.dump(2) + "\n";
  }
  std::string table = absl::StrFormat(
      "strata bench io: %d MiB sequential overwrite then read, %d KiB blocks, queue depth %d, "
      "best of %d, in %s\n"
      "ours: %s engine, O_DIRECT %s; peer: %s, io_uring, direct=1 (MB/s = 1e6 bytes/s)\n\n",
      r.size_mib, r.block_kib, r.queue_depth, r.repeats, r.dir, engine, o_direct ? "on" : "off (filesystem refused it)",
      fio_version);
  absl::StrAppendFormat(&table, "%-8s %12s %12s %10s %10s   %s\n", "", "ours MB/s", "fio MB/s", "ours/fio", "by median",
                        "all runs: ours | fio");
  absl::StrAppendFormat(&table, "%-8s %12.1f %12.1f %10.3f %10.3f   %s | %s\n", "write", ours.write_mbps,
                        fio.write_mbps, write_ratio, write_ratio_median, Spread(ours.write_runs),
                        Spread(fio.write_runs));
  absl::StrAppendFormat(&table, "%-8s %12.1f %12.1f %10.3f %10.3f   %s | %s\n", "read", ours.read_mbps, fio.read_mbps,
                        read_ratio, read_ratio_median, Spread(ours.read_runs), Spread(fio.read_runs));
  return table;
}

}  // namespace strata::bench
