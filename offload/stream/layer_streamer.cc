#include "offload/stream/layer_streamer.h"

#include <c10/util/strides.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "offload/nvme/aligned_buffer.h"

namespace strata::offload {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

absl::Status LayerStreamerOptions::Validate() const {
  if (home != Tier::kHost && home != Tier::kNvme) {
    return absl::InvalidArgumentError("layer streamer: home must be host or nvme");
  }
  if (prefetch_depth < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer streamer: prefetch_depth must be >= 0, got ", prefetch_depth));
  }
  return absl::OkStatus();
}

class LayerStreamerImpl final : public LayerStreamer {
 public:
  LayerStreamerImpl(const LayerStreamerOptions& options, HostArena* arena, NvmeStore* store, TierAccountant* accountant,
                    std::unique_ptr<DeviceTransfer> transfer, DeviceMemoryMonitor* monitor);
  ~LayerStreamerImpl() override;
  absl::StatusOr<int64_t> AddLayer(const std::vector<std::pair<std::string, at::Tensor>>& tensors) override;
  absl::Status StoreTensor(int64_t layer, size_t index, const at::Tensor& value) override;
  std::span<std::byte> HostHome(int64_t layer, size_t index) override;
  absl::StatusOr<at::Tensor> LoadTensor(int64_t layer, size_t index) const override;
  absl::Status BeginPass(std::vector<int64_t> order) override;
  absl::StatusOr<std::vector<at::Tensor>> Acquire(int64_t layer) override;
  void Release(int64_t layer) override;
  void EndPass() override;
  size_t layer_bytes(int64_t layer) const override;
  const std::vector<std::string>& tensor_names(int64_t layer) const override;
  LayerStreamerStats stats() const override;
  int64_t num_layers() const override { return static_cast<int64_t>(layers_.size()); }

 private:
  struct TensorHome {
    std::string name;
    std::vector<int64_t> shape;
    at::ScalarType dtype;
    size_t bytes = 0;
    HostBuffer host;      // kHost
    std::string nvme_id;  // kNvme
  };
  struct Layer {
    std::vector<TensorHome> tensors;
    std::vector<std::string> names;
    size_t bytes = 0;
  };
  struct Fetched {
    int64_t layer = -1;
    absl::Status status;
    std::vector<at::Tensor> tensors;       // empty unless status is OK
    std::shared_ptr<TransferFence> fence;  // compute waits for it at Acquire
  };

  absl::Status WriteHome(TensorHome& home, const at::Tensor& value);
  // CPU device: a tensor for `home` from the window's pool. Fresh buffers
  // above glibc's mmap threshold (32 MiB at most) fault in every page at
  // each fetch (7B-width layers streamed at ~1.4 GB/s instead of ~6); a
  // buffer whose last fetch nobody holds any more is reused instead.
  // `direct_io`: the NVMe store reads into it (see WindowTensor).
  at::Tensor PooledTensor(const TensorHome& home, bool direct_io);
  // Bytes of pooled buffers nobody holds: allocated, but free for fetches.
  size_t IdlePoolBytes();
  // Queues the copies of `layer` to the device (I/O thread).
  absl::Status Fetch(const Layer& layer, Fetched* out);
  void IoLoop();

  const LayerStreamerOptions options_;
  HostArena* const arena_;
  NvmeStore* const store_;
  TierAccountant* const accountant_;
  const std::unique_ptr<DeviceTransfer> transfer_;
  DeviceMemoryMonitor* const monitor_;  // null without a device budget
  std::vector<Layer> layers_;
  std::mutex pool_mu_;
  std::vector<at::Tensor> pool_;  // CPU device only; at most the window's tensors

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool in_pass_ = false;
  std::vector<int64_t> order_;
  size_t next_to_fetch_ = 0;    // index into order_
  size_t next_to_acquire_ = 0;  // index into order_
  size_t released_ = 0;         // layers of the pass released so far
  std::deque<Fetched> ready_;
  size_t resident_bytes_ = 0;
  LayerStreamerStats stats_;
  std::thread io_thread_;
};

absl::StatusOr<std::unique_ptr<LayerStreamer>> LayerStreamer::Create(const LayerStreamerOptions& options,
                                                                     HostArena* arena, NvmeStore* store,
                                                                     TierAccountant* accountant) {
  STRATA_RETURN_IF_ERROR(options.Validate());
  if (options.home == Tier::kHost && arena == nullptr) {
    return absl::InvalidArgumentError("layer streamer: host home needs a host arena");
  }
  if (options.home == Tier::kNvme && store == nullptr) {
    return absl::InvalidArgumentError("layer streamer: nvme home needs an NVMe store");
  }
  if (options.home == Tier::kNvme && !options.device.is_cpu() && arena == nullptr) {
    return absl::InvalidArgumentError("layer streamer: nvme home on a GPU needs a host arena to stage reads in");
  }
  STRATA_ASSIGN_OR_RETURN(auto transfer, DeviceTransfer::Create(options.device));
  if (!options.device.is_cpu() && arena != nullptr && !arena->stats().cuda_pinned) {
    STRATA_LOG(Warning) << "layer streamer: the host arena is not pinned for CUDA; copies to " << options.device.str()
                        << " will be synchronous and slow (set pin_for_cuda)";
  }
  DeviceMemoryMonitor* monitor = nullptr;
  if (options.device_budget_bytes > 0) {
    STRATA_ASSIGN_OR_RETURN(auto found, DeviceMemoryMonitor::ForDevice(options.device));
    monitor = found;
  }
  return std::unique_ptr<LayerStreamer>(
      new LayerStreamerImpl(options, arena, store, accountant, std::move(transfer), monitor));
}

LayerStreamerImpl::LayerStreamerImpl(const LayerStreamerOptions& options, HostArena* arena, NvmeStore* store,
                                     TierAccountant* accountant, std::unique_ptr<DeviceTransfer> transfer,
                                     DeviceMemoryMonitor* monitor)
    : options_(options),
      arena_(arena),
      store_(store),
      accountant_(accountant),
      transfer_(std::move(transfer)),
      monitor_(monitor) {
  io_thread_ = std::thread([this] { IoLoop(); });
}

LayerStreamerImpl::~LayerStreamerImpl() {
  EndPass();
  // Uploads still in flight read from homes and staging in the arena, which
  // may be unmapped right after this.
  (void)transfer_->WaitAll();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  io_thread_.join();
  if (accountant_ != nullptr) {
    for (const Layer& layer : layers_) {
      for (const TensorHome& home : layer.tensors) {
        accountant_->Release(options_.home, options_.home == Tier::kHost ? home.host.reserved() : home.bytes);
      }
    }
  }
}

absl::Status LayerStreamerImpl::WriteHome(TensorHome& home, const at::Tensor& value) {
  const at::Tensor cpu = value.detach().to(at::kCPU, home.dtype).contiguous();
  if (options_.home == Tier::kHost) {
    if (!home.host.valid()) {
      STRATA_ASSIGN_OR_RETURN(auto buffer, arena_->Allocate(home.bytes));
      if (accountant_ != nullptr) {
        STRATA_RETURN_IF_ERROR(accountant_->Reserve(Tier::kHost, buffer.reserved(), home.name));
      }
      home.host = std::move(buffer);
    }
    std::memcpy(home.host.data(), cpu.data_ptr(), home.bytes);
    return absl::OkStatus();
  }
  const bool first = !store_->Contains(home.nvme_id);
  if (first && accountant_ != nullptr) {
    STRATA_RETURN_IF_ERROR(accountant_->Reserve(Tier::kNvme, home.bytes, home.name));
  }
  return store_->Put(home.nvme_id,
                     std::span<const std::byte>(static_cast<const std::byte*>(cpu.data_ptr()), home.bytes));
}

absl::StatusOr<int64_t> LayerStreamerImpl::AddLayer(const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (in_pass_) return absl::FailedPreconditionError("layer streamer: AddLayer during a pass");
  }
  const int64_t index = static_cast<int64_t>(layers_.size());
  Layer layer;
  for (const auto& [name, value] : tensors) {
    TensorHome home;
    home.name = absl::StrCat("layers.", index, ".", name);
    home.shape.assign(value.sizes().begin(), value.sizes().end());
    home.dtype = value.scalar_type();
    home.bytes = static_cast<size_t>(value.numel()) * value.element_size();
    home.nvme_id = options_.nvme_prefix + home.name;
    STRATA_RETURN_IF_ERROR(WriteHome(home, value));
    layer.bytes += home.bytes;
    layer.names.push_back(name);
    layer.tensors.push_back(std::move(home));
  }
  layers_.push_back(std::move(layer));
  return index;
}

absl::Status LayerStreamerImpl::StoreTensor(int64_t layer, size_t index, const at::Tensor& value) {
  {
    // During a pass only a layer the pass has used for the last time may
    // change (an optimizer stepping each layer as its backward ends): no
    // fetch of it is in flight or to come.
    std::lock_guard<std::mutex> lock(mu_);
    if (in_pass_) {
      for (size_t i = next_to_acquire_; i < order_.size(); ++i) {
        if (order_[i] == layer) {
          return absl::FailedPreconditionError(
              absl::StrCat("layer streamer: StoreTensor of layer ", layer, " during a pass that has yet to use it"));
        }
      }
    }
  }
  if (layer < 0 || layer >= num_layers() || index >= layers_[layer].tensors.size()) {
    return absl::OutOfRangeError(absl::StrCat("layer streamer: no tensor ", index, " in layer ", layer));
  }
  TensorHome& home = layers_[layer].tensors[index];
  if (at::IntArrayRef(home.shape) != value.sizes()) {
    return absl::InvalidArgumentError(absl::StrCat("layer streamer: ", home.name, " has shape ",
                                                   c10::str(at::IntArrayRef(home.shape)), ", got ",
                                                   c10::str(value.sizes())));
  }
  return WriteHome(home, value);
}

std::span<std::byte> LayerStreamerImpl::HostHome(int64_t layer, size_t index) {
  if (options_.home != Tier::kHost || layer < 0 || layer >= num_layers() ||
      index >= layers_[static_cast<size_t>(layer)].tensors.size()) {
    return {};
  }
  return layers_[static_cast<size_t>(layer)].tensors[index].host.bytes();
}

absl::StatusOr<at::Tensor> LayerStreamerImpl::LoadTensor(int64_t layer, size_t index) const {
  if (layer < 0 || layer >= num_layers() || index >= layers_[layer].tensors.size()) {
    return absl::OutOfRangeError(absl::StrCat("layer streamer: no tensor ", index, " in layer ", layer));
  }
  const TensorHome& home = layers_[layer].tensors[index];
  at::Tensor out = at::empty(home.shape, at::TensorOptions().dtype(home.dtype));
  if (options_.home == Tier::kHost) {
    std::memcpy(out.data_ptr(), home.host.data(), home.bytes);
    return out;
  }
  if (auto s = store_->Get(home.nvme_id, std::span<std::byte>(static_cast<std::byte*>(out.data_ptr()), home.bytes));
      !s.ok()) {
    return s;
  }
  return out;
}

namespace {
// Held by the pool alone: no handle to the tensor (returned copies share
// its TensorImpl) and no view of its storage remains.
bool Idle(const at::Tensor& t) { return t.use_count() == 1 && t.storage().use_count() == 1; }
}  // namespace

namespace {
// A new tensor for the window. O_DIRECT reads land in place only in
// 4096-aligned memory; elsewhere the NVMe store reads through a bounce
// buffer and copies (7B layers: 1.2 GB/s bounced, 2.1 in place). The
// CPU device's allocator page-aligns tensors of 4 MiB and more, unless an
// operator's MALLOC_MMAP_* settings hand them to glibc, which aligns to 16
// bytes: then a tensor of 1 MiB or more is placed on a page boundary of a
// storage one page larger (set_, not a view: a view would keep its base, and
// the pool would never see it idle). Smaller ones bounce: their copy is
// cheap, and a page each would overshoot the window's byte budget.
at::Tensor WindowTensor(const std::vector<int64_t>& shape, at::ScalarType dtype, size_t bytes, bool direct_io) {
  at::Tensor tensor = at::empty(shape, at::TensorOptions().dtype(dtype));
  const auto address = reinterpret_cast<uintptr_t>(tensor.data_ptr());
  if (!direct_io || address % kDirectIoAlignment == 0 || bytes < (size_t{1} << 20)) return tensor;
  tensor = at::empty({0}, at::TensorOptions().dtype(dtype));  // the misaligned storage goes first
  constexpr auto kAlign = static_cast<int64_t>(kDirectIoAlignment);
  const at::Tensor raw = at::empty({static_cast<int64_t>(bytes) + kAlign}, at::kByte);
  const auto start = reinterpret_cast<uintptr_t>(raw.data_ptr());
  const int64_t offset = (kAlign - static_cast<int64_t>(start % kDirectIoAlignment)) % kAlign;
  tensor.set_(raw.storage(), offset / static_cast<int64_t>(c10::elementSize(dtype)), shape,
              c10::contiguous_strides(shape));
  return tensor;
}
}  // namespace

at::Tensor LayerStreamerImpl::PooledTensor(const TensorHome& home, bool direct_io) {
  std::lock_guard<std::mutex> lock(pool_mu_);
  for (const at::Tensor& t : pool_) {
    // Held only by the pool: the compute that used it has let go.
    if (Idle(t) && t.scalar_type() == home.dtype && t.sizes().vec() == home.shape) return t;
  }
  pool_.push_back(WindowTensor(home.shape, home.dtype, home.bytes, direct_io));
  return pool_.back();
}

size_t LayerStreamerImpl::IdlePoolBytes() {
  std::lock_guard<std::mutex> lock(pool_mu_);
  size_t bytes = 0;
  for (const at::Tensor& t : pool_) {
    if (Idle(t)) bytes += t.storage().nbytes();
  }
  return bytes;
}

size_t LayerStreamerImpl::layer_bytes(int64_t layer) const { return layers_.at(static_cast<size_t>(layer)).bytes; }

const std::vector<std::string>& LayerStreamerImpl::tensor_names(int64_t layer) const {
  return layers_.at(static_cast<size_t>(layer)).names;
}

absl::Status LayerStreamerImpl::Fetch(const Layer& layer, Fetched* out) {
  out->tensors.reserve(layer.tensors.size());
  if (options_.home == Tier::kHost && options_.device.is_cpu()) {
    // The device is the host: copy into the window's pooled tensors.
    for (const TensorHome& home : layer.tensors) {
      at::Tensor device = PooledTensor(home, /*direct_io=*/false);
      std::memcpy(device.data_ptr(), home.host.data(), home.bytes);
      out->tensors.push_back(std::move(device));
    }
    STRATA_ASSIGN_OR_RETURN(auto fence, transfer_->Fence());
    out->fence = std::move(fence);
    return absl::OkStatus();
  }
  if (options_.home == Tier::kHost) {
    // Homes do not change during a pass (StoreTensor refuses), so the
    // uploads need no host-side wait.
    for (const TensorHome& home : layer.tensors) {
      STRATA_ASSIGN_OR_RETURN(auto device, transfer_->Upload(home.host.bytes(), home.shape, home.dtype));
      out->tensors.push_back(std::move(device));
    }
    STRATA_ASSIGN_OR_RETURN(auto fence, transfer_->Fence());
    out->fence = std::move(fence);
    return absl::OkStatus();
  }
  if (options_.device.is_cpu()) {
    // The device is the host: read straight into the layer's tensors, in
    // one batch, so the disk's queue stays full across tensor boundaries
    // (it gains where the tensors' pages are 4 KiB, 1.5-1.9 -> 2.1 GB/s for
    // 7B layers; with the CPU device's huge pages, nothing measurable).
    std::vector<NvmeRead> reads;
    for (const TensorHome& home : layer.tensors) {
      at::Tensor device = PooledTensor(home, /*direct_io=*/true);
      reads.push_back({home.nvme_id, std::span<std::byte>(static_cast<std::byte*>(device.data_ptr()), home.bytes)});
      out->tensors.push_back(std::move(device));
    }
    STRATA_ASSIGN_OR_RETURN(const NvmeStore::Ticket ticket, store_->StartRead(reads));
    STRATA_RETURN_IF_ERROR(store_->Wait(ticket));
    STRATA_ASSIGN_OR_RETURN(auto fence, transfer_->Fence());
    out->fence = std::move(fence);
    return absl::OkStatus();
  }
  // GPU: NVMe -> pinned staging -> device. The staging buffers go back to
  // the arena's pools once the uploads from them are done, also on error.
  std::vector<HostBuffer> staging;
  staging.reserve(layer.tensors.size());
  absl::Status status;
  for (const TensorHome& home : layer.tensors) {
    auto buffer = arena_->Allocate(home.bytes);
    if (!buffer.ok()) {
      status = buffer.status();
      break;
    }
    staging.push_back(*std::move(buffer));
    if (status = store_->Get(home.nvme_id, staging.back().bytes()); !status.ok()) break;
    auto device = transfer_->Upload(staging.back().bytes(), home.shape, home.dtype);
    if (!device.ok()) {
      status = device.status();
      break;
    }
    out->tensors.push_back(*std::move(device));
  }
  auto fence = transfer_->Fence();
  if (!fence.ok()) {
    // The device failed: nothing more will be copied out of staging.
    return status.ok() ? fence.status() : status;
  }
  out->fence = *std::move(fence);
  if (auto s = transfer_->WaitHost(*out->fence); !s.ok() && status.ok()) status = s;
  return status;
}

void LayerStreamerImpl::IoLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    // A fetch may start once fewer than 1 + prefetch_depth layers of the
    // pass are fetched but not yet released.
    cv_.wait(lock, [this] {
      return stop_ || (in_pass_ && next_to_fetch_ < order_.size() &&
                       next_to_fetch_ < released_ + 1 + static_cast<size_t>(options_.prefetch_depth));
    });
    if (stop_) return;
    const int64_t layer = order_[next_to_fetch_];
    const size_t bytes = layers_[static_cast<size_t>(layer)].bytes;
    // Pooled buffers nobody holds are room a fetch reuses, not usage.
    const size_t idle = monitor_ != nullptr && options_.device.is_cpu() ? IdlePoolBytes() : 0;
    if (monitor_ != nullptr &&
        monitor_->current_bytes() - std::min(idle, monitor_->current_bytes()) + bytes + options_.compute_reserve_bytes >
            options_.device_budget_bytes) {
      if (next_to_fetch_ > released_) {
        // Layers are in use: their release frees room. Wait for it.
        const size_t released_before = released_;
        cv_.wait(lock, [&] { return stop_ || !in_pass_ || released_ != released_before; });
        continue;
      }
      ++next_to_fetch_;
      Fetched refused;
      refused.layer = layer;
      refused.status = absl::ResourceExhaustedError(
          absl::StrCat("device tier: layer ", layer, " needs ", bytes, " bytes (+", options_.compute_reserve_bytes,
                       " for its compute), but ", monitor_->current_bytes(), " of the ", options_.device_budget_bytes,
                       "-byte budget are in use with no layer left to release"));
      ready_.push_back(std::move(refused));
      cv_.notify_all();
      continue;
    }
    ++next_to_fetch_;
    lock.unlock();
    const auto start = std::chrono::steady_clock::now();
    Fetched fetched;
    fetched.layer = layer;
    fetched.status = Fetch(layers_[static_cast<size_t>(layer)], &fetched);
    if (!fetched.status.ok()) fetched.tensors.clear();
    const double seconds = SecondsSince(start);
    lock.lock();
    ++stats_.fetches;
    stats_.fetch_seconds += seconds;
    if (fetched.status.ok()) {
      stats_.bytes_fetched += static_cast<int64_t>(layers_[static_cast<size_t>(layer)].bytes);
      resident_bytes_ += layers_[static_cast<size_t>(layer)].bytes;
      stats_.max_resident_bytes = std::max(stats_.max_resident_bytes, resident_bytes_);
    }
    ready_.push_back(std::move(fetched));
    cv_.notify_all();
  }
}

absl::Status LayerStreamerImpl::BeginPass(std::vector<int64_t> order) {
  for (int64_t layer : order) {
    if (layer < 0 || layer >= num_layers()) {
      return absl::OutOfRangeError(absl::StrCat("layer streamer: pass names layer ", layer, " of ", num_layers()));
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (in_pass_) return absl::FailedPreconditionError("layer streamer: a pass is already running");
  order_ = std::move(order);
  next_to_fetch_ = next_to_acquire_ = released_ = 0;
  ready_.clear();
  in_pass_ = true;
  cv_.notify_all();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<at::Tensor>> LayerStreamerImpl::Acquire(int64_t layer) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!in_pass_ || next_to_acquire_ >= order_.size() || order_[next_to_acquire_] != layer) {
    return absl::FailedPreconditionError(absl::StrCat("layer streamer: layer ", layer, " is not next in the pass"));
  }
  const auto start = std::chrono::steady_clock::now();
  cv_.wait(lock, [this] { return !ready_.empty(); });
  stats_.stall_seconds += SecondsSince(start);
  Fetched fetched = std::move(ready_.front());
  ready_.pop_front();
  ++next_to_acquire_;
  if (!fetched.status.ok()) return fetched.status;
  STRATA_RETURN_IF_ERROR(transfer_->ComputeWaits(*fetched.fence, fetched.tensors));
  return std::move(fetched.tensors);
}

void LayerStreamerImpl::Release(int64_t layer) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!in_pass_) return;
  ++released_;
  resident_bytes_ -= std::min(resident_bytes_, layers_[static_cast<size_t>(layer)].bytes);
  cv_.notify_all();
}

void LayerStreamerImpl::EndPass() {
  std::unique_lock<std::mutex> lock(mu_);
  if (!in_pass_) return;
  // Let the I/O thread finish what it started: stop new fetches, then wait
  // until every started fetch has landed in ready_.
  order_.resize(next_to_fetch_);
  cv_.wait(lock, [this] { return next_to_acquire_ + ready_.size() >= next_to_fetch_; });
  ready_.clear();
  in_pass_ = false;
  resident_bytes_ = 0;
  cv_.notify_all();  // an I/O thread waiting for device room stops waiting
}

LayerStreamerStats LayerStreamerImpl::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace strata::offload
