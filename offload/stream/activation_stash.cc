#include "offload/stream/activation_stash.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/heap.h"
#include "base/status_macros.h"
#include "offload/nvme/aligned_buffer.h"

namespace strata::offload {

namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

}  // namespace

absl::StatusOr<std::unique_ptr<ActivationStash>> ActivationStash::Create(const ActivationStashOptions& options,
                                                                         HostArena* arena) {
  if (options.home != Tier::kDevice && arena == nullptr) {
    return absl::InvalidArgumentError("activations on the host or NVMe need a host arena");
  }
  if (options.home == Tier::kNvme && options.nvme_directory.empty()) {
    return absl::InvalidArgumentError("activations on NVMe need an NVMe directory");
  }
  std::unique_ptr<ActivationStash> stash(new ActivationStash(options, arena));
  if (options.home != Tier::kDevice) {
    STRATA_ASSIGN_OR_RETURN(stash->transfer_, DeviceTransfer::Create(options.device));
  }
  return stash;
}

ActivationStash::~ActivationStash() { End(); }

absl::Status ActivationStash::Begin(int64_t count, int64_t bytes) {
  End();
  if (count < 0 || bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("activation stash: bad step of ", count, " x ", bytes, " bytes"));
  }
  count_ = count, bytes_ = bytes, next_put_ = 0, next_take_ = count - 1;
  switch (options_.home) {
    case Tier::kDevice:
      on_device_.resize(static_cast<size_t>(count));
      break;
    case Tier::kHost:
      STRATA_RETURN_IF_ERROR(Grow(host_copies_, static_cast<size_t>(count * Stride())));
      break;
    case Tier::kNvme: {
      const int64_t slot = Stride();
      // The last two stay staged (FinishDownload): slots for the rest only.
      const int64_t written = std::max<int64_t>(count - 2, 0);
      if (written > 0 && (scratch_ == nullptr || scratch_->slot_bytes() < slot || scratch_->slots() < written)) {
        // Grown by half again, as the host buffers are, so that varying
        // sequence lengths do not reallocate it step after step.
        ScratchFileOptions scratch;
        scratch.slot_bytes = scratch_ == nullptr ? slot : std::max(slot, scratch_->slot_bytes() * 3 / 2);
        scratch.slots = written;
        scratch_.reset();  // its blocks go back before the larger file takes its own
        scratch.directory = options_.nvme_directory;
        scratch.engine = options_.engine;
        STRATA_ASSIGN_OR_RETURN(scratch_, ScratchFile::Create(scratch));
      }
      for (Staging& s : staging_) STRATA_RETURN_IF_ERROR(Grow(s.buffer, static_cast<size_t>(slot)));
      break;
    }
  }
  return absl::OkStatus();
}

int64_t ActivationStash::Stride() const {
  return static_cast<int64_t>(RoundUpTo(static_cast<size_t>(bytes_), kDirectIoAlignment));
}

std::span<std::byte> ActivationStash::HostCopy(int64_t i) const {
  return host_copies_.bytes().subspan(static_cast<size_t>(i * Stride()), static_cast<size_t>(bytes_));
}

absl::Status ActivationStash::Grow(HostBuffer& buffer, size_t bytes) {
  if (buffer.size() >= bytes) return absl::OkStatus();
  // The arena pools what is given back by size, never merging it: growing
  // by half again (to whole huge pages) bounds how many sizes a run of
  // varying sequence lengths leaves there.
  const size_t grown = RoundUpTo(std::max(bytes, buffer.size() + buffer.size() / 2), kHugePageBytes);
  buffer = HostBuffer();
  STRATA_ASSIGN_OR_RETURN(buffer, arena_->Allocate(grown));
  return absl::OkStatus();
}

absl::Status ActivationStash::Put(int64_t i, const at::Tensor& tensor) {
  if (i != next_put_ || i >= count_) {
    return absl::FailedPreconditionError(
        absl::StrCat("activation stash: put ", i, " out of order (expected ", next_put_, " of ", count_, ")"));
  }
  const at::Tensor t = tensor.contiguous();
  if (static_cast<int64_t>(t.nbytes()) != bytes_) {
    return absl::InvalidArgumentError(
        absl::StrCat("activation stash: tensor ", i, " has ", t.nbytes(), " bytes, the step's have ", bytes_));
  }
  if (i == 0) shape_ = t.sizes().vec(), dtype_ = t.scalar_type();
  ++next_put_;
  if (options_.home == Tier::kDevice) {
    on_device_[static_cast<size_t>(i)] = t;
    return absl::OkStatus();
  }
  STRATA_RETURN_IF_ERROR(FinishDownload());
  std::span<std::byte> target;
  if (options_.home == Tier::kHost) {
    target = HostCopy(i);
  } else {
    Staging& s = staging_[static_cast<size_t>(i % 2)];
    STRATA_RETURN_IF_ERROR(Reclaim(s));
    s.holds = i;
    target = s.buffer.bytes().first(static_cast<size_t>(bytes_));
  }
  STRATA_RETURN_IF_ERROR(transfer_->Download(t, target));
  STRATA_ASSIGN_OR_RETURN(auto fence, transfer_->Fence());
  download_ = Download{i, t, std::move(fence)};
  return absl::OkStatus();
}

absl::StatusOr<at::Tensor> ActivationStash::Take(int64_t i) {
  if (i != next_take_ || next_put_ != count_) {
    return absl::FailedPreconditionError(absl::StrCat("activation stash: take ", i, " out of order (expected ",
                                                      next_take_, ", ", next_put_, " of ", count_, " put)"));
  }
  --next_take_;
  if (options_.home == Tier::kDevice) return std::move(on_device_[static_cast<size_t>(i)]);
  STRATA_RETURN_IF_ERROR(FinishDownload());
  at::Tensor tensor;
  if (options_.home == Tier::kHost) {
    if (upload_.has_value() && upload_->index == i) {
      tensor = std::move(upload_->tensor);
      STRATA_RETURN_IF_ERROR(transfer_->ComputeWaits(*upload_->fence, {&tensor, 1}));
      upload_.reset();
    } else {
      STRATA_ASSIGN_OR_RETURN(tensor, UploadNow(HostCopy(i), nullptr));
    }
    if (i > 0) {
      // Started now, waited for by compute only when taken: the copy runs
      // beside layer i's recomputation.
      STRATA_ASSIGN_OR_RETURN(at::Tensor next, transfer_->Upload(HostCopy(i - 1), shape_, dtype_));
      STRATA_ASSIGN_OR_RETURN(auto fence, transfer_->Fence());
      upload_ = Upload{i - 1, std::move(next), std::move(fence)};
    }
    return tensor;
  }
  if (staging_[0].holds != i && staging_[1].holds != i) STRATA_RETURN_IF_ERROR(Prefetch(i, i + 1));
  Staging& s = staging_[staging_[0].holds == i ? 0 : 1];
  STRATA_RETURN_IF_ERROR(WaitTicket(s.read));
  STRATA_ASSIGN_OR_RETURN(tensor, UploadNow(s.buffer.bytes().first(static_cast<size_t>(bytes_)), &s.upload));
  if (i > 0) STRATA_RETURN_IF_ERROR(Prefetch(i - 1, i));
  return tensor;
}

void ActivationStash::End() {
  // Errors are the step's to report; here everything in flight only has to
  // stop touching the buffers before they are dropped.
  if (download_.has_value()) (void)transfer_->WaitHost(*download_->fence);
  download_.reset();
  if (upload_.has_value()) (void)transfer_->WaitHost(*upload_->fence);
  upload_.reset();
  for (Staging& s : staging_) {
    (void)WaitTicket(s.write);
    (void)WaitTicket(s.read);
    if (s.upload != nullptr) (void)transfer_->WaitHost(*s.upload);
    s.upload.reset();
    s.holds = -1;
  }
  on_device_.clear();
  count_ = 0, next_put_ = 0, next_take_ = -1;
}

absl::Status ActivationStash::FinishDownload() {
  if (!download_.has_value()) return absl::OkStatus();
  Download done = std::move(*download_);
  download_.reset();
  const Clock::time_point start = Clock::now();
  STRATA_RETURN_IF_ERROR(transfer_->WaitHost(*done.fence));
  stats_.wait_seconds += SecondsSince(start);
  // The last two stay staged until backward takes them: never written.
  if (options_.home != Tier::kNvme || done.index >= count_ - 2) return absl::OkStatus();
  Staging& s = staging_[static_cast<size_t>(done.index % 2)];
  STRATA_ASSIGN_OR_RETURN(s.write, scratch_->StartWrite(done.index, s.buffer.bytes().first(Stride())));
  stats_.bytes_written += Stride();
  return absl::OkStatus();
}

absl::Status ActivationStash::WaitTicket(std::optional<ScratchFile::Ticket>& ticket) {
  if (!ticket.has_value()) return absl::OkStatus();
  const ScratchFile::Ticket t = *ticket;
  ticket.reset();
  const Clock::time_point start = Clock::now();
  absl::Status status = scratch_->Wait(t);
  stats_.wait_seconds += SecondsSince(start);
  return status;
}

absl::Status ActivationStash::Reclaim(Staging& s) {
  STRATA_RETURN_IF_ERROR(WaitTicket(s.write));
  STRATA_RETURN_IF_ERROR(WaitTicket(s.read));
  if (s.upload != nullptr) STRATA_RETURN_IF_ERROR(transfer_->WaitHost(*s.upload));
  s.upload.reset();
  s.holds = -1;
  return absl::OkStatus();
}

absl::Status ActivationStash::Prefetch(int64_t i, int64_t in_use) {
  if (staging_[0].holds == i || staging_[1].holds == i) {
    ++stats_.reads_saved;
    return absl::OkStatus();
  }
  // Not the buffer the device may still be copying `in_use` from.
  Staging& s = staging_[staging_[0].holds == in_use ? 1 : 0];
  STRATA_RETURN_IF_ERROR(Reclaim(s));
  s.holds = i;
  STRATA_ASSIGN_OR_RETURN(s.read, scratch_->StartRead(i, s.buffer.bytes().first(Stride())));
  stats_.bytes_read += Stride();
  return absl::OkStatus();
}

absl::StatusOr<at::Tensor> ActivationStash::UploadNow(std::span<const std::byte> bytes,
                                                      std::shared_ptr<TransferFence>* fence_out) {
  STRATA_ASSIGN_OR_RETURN(at::Tensor tensor, transfer_->Upload(bytes, shape_, dtype_));
  STRATA_ASSIGN_OR_RETURN(auto fence, transfer_->Fence());
  STRATA_RETURN_IF_ERROR(transfer_->ComputeWaits(*fence, {&tensor, 1}));
  if (fence_out != nullptr) *fence_out = std::move(fence);
  return tensor;
}

}  // namespace strata::offload
