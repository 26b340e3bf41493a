// `strata bench io`: sequential write-then-read bandwidth of the NVMe store
// against fio (io_uring engine, O_DIRECT) in the same run, on the same
// directory, with the same file size, block size and queue depth.
//
// Fairness: both sides preallocate their file with fallocate (our Reserve,
// fio's fallocate=native) and write it once, untimed, before the timed
// pass, so both measure overwriting allocated blocks. That is the store's
// steady state (optimizer slots are rewritten every step), and it keeps the
// comparison away from first-write costs that depend on which blocks the
// filesystem happened to hand out (unwritten-extent conversion, and on a VM
// disk mounted with discard, host-side reallocation of punched blocks).
// Both bypass the page cache with O_DIRECT, both register their files and
// buffers with io_uring (fio: registerfiles, fixedbufs), and both make the
// write durable inside the timed pass (our fdatasync and journal commits,
// fio's end_fsync=1). MB/s means 1e6 bytes per second. The *_ratio fields
// compare the best runs of each side; *_ratio_median the medians.
#ifndef STRATA_BENCH_IO_BENCH_H_
#define STRATA_BENCH_IO_BENCH_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace strata::bench {

struct IoBenchRequest {
  // Existing directory on the device to measure; the benchmark works in a
  // fresh subdirectory of it and removes it afterwards.
  std::string dir;
  // Bytes each side writes and then reads, in MiB.
  int64_t size_mib = 1024;
  // I/O size in KiB: our block_size and fio's bs. A multiple of 4.
  int64_t block_kib = 1024;
  // Requests in flight: our queue_depth and fio's iodepth.
  int queue_depth = 32;
  // Our I/O engine: "auto", "uring" or "posix".
  std::string engine = "auto";
  // Each side runs this many times, alternating which goes first; the best
  // run of each counts.
  int repeats = 3;
  // The fio binary (looked up on PATH unless absolute).
  std::string fio = "fio";
  // JSON object instead of a table.
  bool json = false;
};

// Runs the comparison and returns the report: a table, or JSON with the keys
// ours_write_mbps, ours_read_mbps, fio_write_mbps, fio_read_mbps,
// write_ratio, read_ratio (best run of each side), plus engine, o_direct,
// size_mib, block_kib, queue_depth, repeats, fio_version, mb, and every
// run's figure in *_mbps_runs so the spread is visible. INVALID_ARGUMENT for bad sizes, NOT_FOUND for a
// missing directory or fio, INTERNAL when fio fails or a read-back differs.
absl::StatusOr<std::string> RunIoBench(const IoBenchRequest& request);

}  // namespace strata::bench

#endif  // STRATA_BENCH_IO_BENCH_H_
