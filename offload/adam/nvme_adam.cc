#include "offload/adam/nvme_adam.h"

#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace strata::offload {
namespace {

// A tile's bytes on NVMe and in staging: master | exp_avg | exp_avg_sq, or
// the master alone for a master-only tensor.
size_t TileBytes(int64_t count, bool master_only = false) {
  return static_cast<size_t>(count) * (master_only ? 1 : 3) * sizeof(float);
}

std::span<const std::byte> AsBytes(const HostBuffer& buffer, size_t bytes) { return {buffer.data(), bytes}; }

}  // namespace

absl::Status NvmeAdamOptions::Validate() const {
  if (tile_elements < 1024) {
    return absl::InvalidArgumentError(absl::StrCat("nvme adam: tile_elements must be >= 1024, got ", tile_elements));
  }
  if (staging_buffers < 2) {
    return absl::InvalidArgumentError(absl::StrCat("nvme adam: staging_buffers must be >= 2, got ", staging_buffers));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<NvmeAdamState>> NvmeAdamState::Create(const NvmeAdamOptions& options, NvmeStore* store,
                                                                     HostArena* arena, CpuAdam* adam) {
  STRATA_RETURN_IF_ERROR(options.Validate());
  if (store == nullptr || arena == nullptr || adam == nullptr) {
    return absl::InvalidArgumentError("nvme adam: needs an NVMe store, a host arena and a CPU Adam");
  }
  std::unique_ptr<NvmeAdamState> state(new NvmeAdamState(options, store, adam));
  for (int i = 0; i < options.staging_buffers; ++i) {
    STRATA_ASSIGN_OR_RETURN(auto buffer, arena->Allocate(TileBytes(options.tile_elements)));
    state->staging_.push_back(std::move(buffer));
  }
  return state;
}

std::vector<NvmeAdamState::Tile> NvmeAdamState::TilesOf(const std::string& name, int64_t elements) const {
  std::vector<Tile> tiles;
  for (int64_t offset = 0, k = 0; offset < elements; offset += options_.tile_elements, ++k) {
    tiles.push_back({absl::StrCat(options_.id_prefix, name, master_only(name) ? ".master." : ".adam.", k), offset,
                     std::min(options_.tile_elements, elements - offset)});
  }
  return tiles;
}

absl::Status NvmeAdamState::Register(const std::string& name, std::span<const float> master) {
  const int64_t n = static_cast<int64_t>(master.size());
  HostBuffer& buffer = staging_[0];
  for (const Tile& tile : TilesOf(name, n)) {
    float* out = buffer.floats().data();
    std::memcpy(out, master.data() + tile.offset, static_cast<size_t>(tile.count) * sizeof(float));
    std::memset(out + tile.count, 0, static_cast<size_t>(tile.count) * 2 * sizeof(float));
    STRATA_RETURN_IF_ERROR(store_->Put(tile.id, AsBytes(buffer, TileBytes(tile.count))));
  }
  elements_[name] = n;
  return absl::OkStatus();
}

absl::Status NvmeAdamState::RegisterMaster(const std::string& name, std::span<const float> master) {
  master_only_.insert(name);
  return WriteMaster(name, master);
}

absl::Status NvmeAdamState::ReadMaster(const std::string& name, std::span<float> master) {
  const int64_t n = num_elements(name);
  if (n < 0 || !master_only(name)) {
    return absl::NotFoundError(absl::StrCat("nvme adam: tensor ", name, " was never registered master-only"));
  }
  if (master.size() != static_cast<size_t>(n)) {
    return absl::InvalidArgumentError(absl::StrCat("nvme adam: master span of ", name, " must have ", n, " elements"));
  }
  HostBuffer& buffer = staging_[0];
  for (const Tile& tile : TilesOf(name, n)) {
    const size_t bytes = TileBytes(tile.count, true);
    STRATA_RETURN_IF_ERROR(store_->Get(tile.id, std::span<std::byte>(buffer.data(), bytes)));
    std::memcpy(master.data() + tile.offset, buffer.data(), bytes);
  }
  return absl::OkStatus();
}

absl::Status NvmeAdamState::WriteMaster(const std::string& name, std::span<const float> master) {
  if (!master_only(name)) {
    return absl::NotFoundError(absl::StrCat("nvme adam: tensor ", name, " was never registered master-only"));
  }
  const int64_t n = static_cast<int64_t>(master.size());
  HostBuffer& buffer = staging_[0];
  for (const Tile& tile : TilesOf(name, n)) {
    const size_t bytes = TileBytes(tile.count, true);
    std::memcpy(buffer.data(), master.data() + tile.offset, bytes);
    STRATA_RETURN_IF_ERROR(store_->Put(tile.id, AsBytes(buffer, bytes)));
  }
  elements_[name] = n;
  return absl::OkStatus();
}

int64_t NvmeAdamState::num_elements(const std::string& name) const {
  auto it = elements_.find(name);
  return it == elements_.end() ? -1 : it->second;
}

size_t NvmeAdamState::staging_bytes() const {
  size_t bytes = 0;
  for (const HostBuffer& b : staging_) bytes += b.reserved();
  return bytes;
}

absl::Status NvmeAdamState::Step(std::span<const NvmeAdamUpdate> updates) {
  // Flatten every tensor's tiles into one pipeline.
  struct Work {
    const NvmeAdamUpdate* update;
    Tile tile;
    bool master_only = false;
  };
  std::vector<Work> work;
  for (const NvmeAdamUpdate& u : updates) {
    const int64_t n = num_elements(u.name);
    if (n < 0) return absl::NotFoundError(absl::StrCat("nvme adam: tensor ", u.name, " was never registered"));
    const bool direction = master_only(u.name);
    const size_t given = direction ? u.direction.size() : u.grad.size();
    if (static_cast<int64_t>(given) != n) {
      return absl::InvalidArgumentError(absl::StrCat("nvme adam: ", direction ? "direction" : "gradient", " of ",
                                                     u.name, " has ", given, " elements, expected ", n));
    }
    for (const Tile& tile : TilesOf(u.name, n)) work.push_back({&u, tile, direction});
  }
  const size_t slots = staging_.size();
  // Per staging slot: the ticket of the I/O last started on it (read or write).
  std::vector<std::optional<NvmeStore::Ticket>> pending(slots);
  absl::Status first_error;
  auto wait_slot = [&](size_t slot) {
    if (!pending[slot].has_value()) return;
    absl::Status s = store_->Wait(*pending[slot]);
    if (!s.ok() && first_error.ok()) first_error = s;
    pending[slot].reset();
  };
  auto start_read = [&](size_t i) {
    const size_t slot = i % slots;
    wait_slot(slot);  // its previous tile's write-back must land first
    const Tile& tile = work[i].tile;
    auto ticket = store_->StartRead(tile.id, std::span<std::byte>(staging_[slot].data(),
                                                                  TileBytes(tile.count, work[i].master_only)));
    if (!ticket.ok()) {
      if (first_error.ok()) first_error = ticket.status();
      return;
    }
    pending[slot] = *ticket;
  };

  if (!work.empty()) start_read(0);
  for (size_t i = 0; i < work.size() && first_error.ok(); ++i) {
    if (i + 1 < work.size()) start_read(i + 1);  // read ahead while this tile updates
    const size_t slot = i % slots;
    wait_slot(slot);
    if (!first_error.ok()) break;
    const Work& w = work[i];
    const size_t count = static_cast<size_t>(w.tile.count);
    const size_t offset = static_cast<size_t>(w.tile.offset);
    float* base = staging_[slot].floats().data();
    if (w.master_only) {
      DirectionSpan span;
      span.name = w.update->name;
      span.param = {base, count};
      span.direction = w.update->direction.subspan(offset, count);
      if (!w.update->out_fp32.empty()) span.device_fp32 = w.update->out_fp32.subspan(offset, count);
      if (!w.update->out_bf16.empty()) span.device_bf16 = w.update->out_bf16.subspan(offset, count);
      if (auto s = adam_->ApplyDirection({&span, 1}); !s.ok()) {
        first_error = s;
        break;
      }
    } else {
      AdamTensorSpan span;
      span.name = w.update->name;
      span.param = {base, count};
      span.exp_avg = {base + count, count};
      span.exp_avg_sq = {base + 2 * count, count};
      span.grad = w.update->grad.subspan(offset, count);
      if (!w.update->out_fp32.empty()) span.device_fp32 = w.update->out_fp32.subspan(offset, count);
      if (!w.update->out_bf16.empty()) span.device_bf16 = w.update->out_bf16.subspan(offset, count);
      span.step = w.update->step;
      if (auto s = adam_->Step(span); !s.ok()) {
        first_error = s;
        break;
      }
    }
    auto ticket = store_->StartWrite(w.tile.id, AsBytes(staging_[slot], TileBytes(w.tile.count, w.master_only)));
    if (!ticket.ok()) {
      first_error = ticket.status();
      break;
    }
    pending[slot] = *ticket;
  }
  for (size_t slot = 0; slot < slots; ++slot) wait_slot(slot);
  return first_error;
}

absl::StatusOr<std::vector<float>> NvmeAdamState::Master(const std::string& name) {
  const int64_t n = num_elements(name);
  if (n < 0) return absl::NotFoundError(absl::StrCat("nvme adam: tensor ", name, " was never registered"));
  if (master_only(name)) {
    std::vector<float> master(static_cast<size_t>(n));
    STRATA_RETURN_IF_ERROR(ReadMaster(name, master));
    return master;
  }
  std::vector<float> master(static_cast<size_t>(n)), m(static_cast<size_t>(n)), v(static_cast<size_t>(n));
  STRATA_RETURN_IF_ERROR(ReadState(name, master, m, v));
  return master;
}

absl::Status NvmeAdamState::ReadState(const std::string& name, std::span<float> master, std::span<float> exp_avg,
                                      std::span<float> exp_avg_sq) {
  const int64_t n = num_elements(name);
  if (n < 0) return absl::NotFoundError(absl::StrCat("nvme adam: tensor ", name, " was never registered"));
  if (master.size() != static_cast<size_t>(n) || exp_avg.size() != master.size() ||
      exp_avg_sq.size() != master.size()) {
    return absl::InvalidArgumentError(absl::StrCat("nvme adam: state spans of ", name, " must have ", n, " elements"));
  }
  HostBuffer& buffer = staging_[0];
  for (const Tile& tile : TilesOf(name, n)) {
    STRATA_RETURN_IF_ERROR(store_->Get(tile.id, std::span<std::byte>(buffer.data(), TileBytes(tile.count))));
    const float* base = buffer.floats().data();
    const size_t count = static_cast<size_t>(tile.count), offset = static_cast<size_t>(tile.offset);
    std::memcpy(master.data() + offset, base, count * sizeof(float));
    std::memcpy(exp_avg.data() + offset, base + count, count * sizeof(float));
    std::memcpy(exp_avg_sq.data() + offset, base + 2 * count, count * sizeof(float));
  }
  return absl::OkStatus();
}

absl::Status NvmeAdamState::WriteState(const std::string& name, std::span<const float> master,
                                       std::span<const float> exp_avg, std::span<const float> exp_avg_sq) {
  const int64_t n = static_cast<int64_t>(master.size());
  if (exp_avg.size() != master.size() || exp_avg_sq.size() != master.size()) {
    return absl::InvalidArgumentError(absl::StrCat("nvme adam: state spans of ", name, " differ in length"));
  }
  HostBuffer& buffer = staging_[0];
  for (const Tile& tile : TilesOf(name, n)) {
    float* base = buffer.floats().data();
    const size_t count = static_cast<size_t>(tile.count), offset = static_cast<size_t>(tile.offset);
    std::memcpy(base, master.data() + offset, count * sizeof(float));
    std::memcpy(base + count, exp_avg.data() + offset, count * sizeof(float));
    std::memcpy(base + 2 * count, exp_avg_sq.data() + offset, count * sizeof(float));
    STRATA_RETURN_IF_ERROR(store_->Put(tile.id, AsBytes(buffer, TileBytes(tile.count))));
  }
  elements_[name] = n;
  return absl::OkStatus();
}

}  // namespace strata::offload
