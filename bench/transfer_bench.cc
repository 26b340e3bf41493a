#include "bench/transfer_bench.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "bench/stats.h"
#include "offload/device/device_transfer.h"
#include "offload/host/host_arena.h"

namespace strata::bench {
namespace {

// Runs `copy` once untimed, then `repeats` times; returns the median rate in
// GB/s (1e9 bytes). `copy` must return only when the bytes have landed.
absl::StatusOr<double> MedianRate(int repeats, size_t bytes, const std::function<absl::Status()>& copy) {
  std::vector<double> rates;
  for (int i = 0; i <= repeats; ++i) {
    const auto start = std::chrono::steady_clock::now();
    STRATA_RETURN_IF_ERROR(copy());
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (i > 0) rates.push_back(static_cast<double>(bytes) / seconds / 1e9);
  }
  return Median(std::move(rates));
}

absl::Status Run(const std::function<void()>& torch_call) {
  try {
    torch_call();
    return absl::OkStatus();
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("torch copy: ", std::string(e.what())));
  }
}

}  // namespace

absl::StatusOr<std::string> RunTransferBench(const TransferBenchRequest& r) {
  if (r.size_mib < 1 || r.size_mib > (int64_t{1} << 20)) {
    return absl::InvalidArgumentError(absl::StrCat("--size-mib must be in [1, 2^20], got ", r.size_mib));
  }
  if (r.repeats < 1) return absl::InvalidArgumentError(absl::StrCat("--repeats must be >= 1, got ", r.repeats));
  STRATA_ASSIGN_OR_RETURN(auto device, offload::ParseComputeDevice(r.device));
  STRATA_ASSIGN_OR_RETURN(auto transfer, offload::DeviceTransfer::Create(device));
  const bool gpu = !device.is_cpu();
  const size_t bytes = static_cast<size_t>(r.size_mib) << 20;

  // Ours: two buffers of the (pinned) arena, as the streamer uses it.
  offload::HostArenaOptions arena_options;
  arena_options.capacity_bytes = 2 * bytes;
  arena_options.pin_for_cuda = gpu;
  STRATA_ASSIGN_OR_RETURN(auto arena, offload::HostArena::Create(arena_options));
  auto source = arena->Allocate(bytes);
  auto sink = arena->Allocate(bytes);
  if (!source.ok()) return source.status();
  if (!sink.ok()) return sink.status();
  for (size_t i = 0; i < bytes; i += 4096) source->data()[i] = static_cast<std::byte>(i / 4096);

  offload::DeviceTransfer& t = *transfer;
  at::Tensor on_device;
  auto ours_h2d = MedianRate(r.repeats, bytes, [&]() -> absl::Status {
    on_device = at::Tensor();  // as the peer: the previous copy's memory is free for this one
    STRATA_ASSIGN_OR_RETURN(on_device, t.Upload(source->bytes(), {static_cast<int64_t>(bytes)}, at::kByte));
    return t.WaitAll();
  });
  if (!ours_h2d.ok()) return ours_h2d.status();
  STRATA_ASSIGN_OR_RETURN(auto ours_d2h, MedianRate(r.repeats, bytes, [&]() -> absl::Status {
                            STRATA_RETURN_IF_ERROR(t.Download(on_device, sink->bytes()));
                            return t.WaitAll();
                          }));
  if (std::memcmp(source->data(), sink->data(), bytes) != 0) {
    return absl::InternalError("bench transfer: bytes came back different from the device");
  }
  on_device = at::Tensor();

  // Peer: libtorch's pinned tensor and copy_ (pinned memory only on a GPU
  // build; on the CPU both tensors are ordinary).
  // Like ours, each upload allocates its device tensor (what Tensor::to
  // does), so both sides pay the same allocator.
  at::Tensor pinned;
  at::Tensor device_tensor;
  if (auto s = Run([&] {
        pinned = at::empty({static_cast<int64_t>(bytes)}, at::TensorOptions().dtype(at::kByte).pinned_memory(gpu));
        std::memcpy(pinned.data_ptr(), source->data(), bytes);
      });
      !s.ok()) {
    return s;
  }
  auto torch_h2d = MedianRate(r.repeats, bytes, [&]() -> absl::Status {
    if (auto s = Run([&] {
          device_tensor = at::Tensor();
          device_tensor = at::empty({static_cast<int64_t>(bytes)}, at::TensorOptions().dtype(at::kByte).device(device));
          device_tensor.copy_(pinned, /*non_blocking=*/true);
        });
        !s.ok()) {
      return s;
    }
    return offload::SynchronizeDevice(device);
  });
  if (!torch_h2d.ok()) return torch_h2d.status();
  auto torch_d2h = MedianRate(r.repeats, bytes, [&]() -> absl::Status {
    STRATA_RETURN_IF_ERROR(Run([&] { pinned.copy_(device_tensor, /*non_blocking=*/true); }));
    return offload::SynchronizeDevice(device);
  });
  if (!torch_d2h.ok()) return torch_d2h.status();

  const double h2d_ratio = *ours_h2d / *torch_h2d;
  const double d2h_ratio = ours_d2h / *torch_d2h;
  if (r.json) {
    const nlohmann::json j{{"device", device.str()},
                           {"size_mib", r.size_mib},
                           {"repeats", r.repeats},
                           {"ours_h2d_gbps", *ours_h2d},
                           {"ours_d2h_gbps", ours_d2h},
                           {"torch_h2d_gbps", *torch_h2d},
                           {"torch_d2h_gbps", *torch_d2h},
                           {"h2d_ratio", h2d_ratio},
                           {"d2h_ratio", d2h_ratio},
                           {"arena_pinned", arena->stats().cuda_pinned},
                           {"gb", "1e9 bytes"}};
    return j.dump() + "\n";
  }
  std::string table = absl::StrFormat(
      "strata bench transfer: %d MiB per copy to and from %s, median of %d (GB/s = 1e9 bytes/s)\n"
      "ours: host arena%s through DeviceTransfer; peer: torch %s tensor, copy_(non_blocking) + synchronize\n\n",
      r.size_mib, device.str(), r.repeats, gpu ? " (cudaHostRegister'ed)" : "", gpu ? "pinned" : "CPU");
  absl::StrAppendFormat(&table, "%-14s %10s %10s %9s\n", "", "ours", "torch", "ours/torch");
  absl::StrAppendFormat(&table, "%-14s %10.2f %10.2f %9.3f\n", "host->device", *ours_h2d, *torch_h2d, h2d_ratio);
  absl::StrAppendFormat(&table, "%-14s %10.2f %10.2f %9.3f\n", "device.host", ours_d2h, *torch_d2h, d2h_ratio);
  return table;
}

}  // namespace strata::bench
