// How a bucket of tensors travels as one flat buffer: the tensors one after
// another, and, for ZeRO-2's reduce-scatter, each rank's tensors in a part
// of their own. Pure tensor code: the process group packs with it on every
// backend, and the tests check the layouts by hand on the CPU, where
// libtorch 1.13's Gloo has no reduce-scatter to run them through.
#ifndef STRATA_POLICIES_DIST_FLAT_BUCKET_H_
#define STRATA_POLICIES_DIST_FLAT_BUCKET_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace strata::policies {

// Elements in all of `tensors`.
int64_t TotalElements(const std::vector<at::Tensor>& tensors);

// Copies `tensors` one after another into the start of `flat` (1-D, at
// least TotalElements long, any device); UnpackFlat copies them back,
// reshaped. Either may throw as libtorch does (a wrong length, say).
void PackFlat(const std::vector<at::Tensor>& tensors, const at::Tensor& flat);
void UnpackFlat(const at::Tensor& flat, std::vector<at::Tensor>& tensors);

// A reduce-scatter's input: rank r's tensors (`owned[r]`, as PackFlat lays
// them out) at [r * part_length, (r + 1) * part_length), zero-padded to the
// longest rank's elements, so that every rank receives an equal part. After
// the sum, rank r unpacks its own part into owned[r].
struct OwnerPartitionedBucket {
  at::Tensor flat;          // owned.size() * part_length elements; undefined when part_length is 0
  int64_t part_length = 0;  // elements per rank
};

// Whether a ring reduce-scatter of that layout puts fewer bytes on the
// wire than a ring all-reduce of the tensors themselves: it sends
// (N-1)/N of its padded input, N x the longest part, where the all-reduce
// sends 2(N-1)/N of the total; so, when N x longest < 2 x total. Parts are
// whole tensors: a bucket of one tensor (an embedding) pads N-fold and is
// cheaper all-reduced, a decoder layer's seven matrices over 8 ranks are
// not (8 x 45M < 2 x 202M for Llama-2-7B).
bool ReduceScatterMovesLess(const std::vector<std::vector<at::Tensor>>& owned);

// Lays `owned` out on `device`. INVALID_ARGUMENT when its tensors do not
// share one dtype. Throws as libtorch does when the device cannot hold it.
absl::StatusOr<OwnerPartitionedBucket> PackByOwner(const std::vector<std::vector<at::Tensor>>& owned,
                                                   const at::Device& device);

}  // namespace strata::policies

#endif  // STRATA_POLICIES_DIST_FLAT_BUCKET_H_
