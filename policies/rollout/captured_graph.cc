#include "policies/rollout/captured_graph.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <exception>

#if STRATA_WITH_CUDA
// libtorch 1.13's and 2.x's common API (capture_begin(pool), capture_end,
// replay, graph_pool_handle, external streams, emptyCache), and 2.x's
// capture modes.
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/version.h>

#include <map>
#include <mutex>
#endif

#include "base/log.h"

namespace strata::policies {

namespace {

// Set once a capture has failed: later rollouts in this process run eager
// steps (the failed capture may have left libtorch's allocator in its
// capture mode; nothing more is asked of it).
std::atomic<bool> capture_failed{false};

}  // namespace

#if STRATA_WITH_CUDA
namespace {

class CudaGraph final : public CapturedGraph {
 public:
  void Replay() override { graph_.replay(); }
  at::cuda::CUDAGraph& graph() { return graph_; }

 private:
  at::cuda::CUDAGraph graph_;
};

// The device's stream for rollouts, made once and kept: capture records
// whatever runs on the captured stream, so it must be one no other thread
// (the offload engine's copies, NCCL) is handed, as libtorch's stream pool
// would.
c10::cuda::CUDAStream RolloutStream(const c10::Device& device) {
  static std::mutex mutex;
  static std::map<c10::DeviceIndex, cudaStream_t>* streams = new std::map<c10::DeviceIndex, cudaStream_t>();
  const c10::DeviceIndex index = device.has_index() ? device.index() : c10::cuda::current_device();
  std::lock_guard<std::mutex> lock(mutex);
  auto it = streams->find(index);
  if (it == streams->end()) {
    c10::cuda::CUDAGuard on_device(index);
    cudaStream_t stream = nullptr;
    C10_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    it = streams->emplace(index, stream).first;
  }
  return c10::cuda::getStreamFromExternal(it->second, index);
}

// The rollout's stream, once what the current stream has queued is done (a
// host wait once a rollout is simpler than ordering the streams by events).
c10::cuda::CUDAStream StartAfterCurrent(const c10::Device& device) {
  c10::cuda::CUDAStream stream = RolloutStream(device);
  c10::cuda::getCurrentCUDAStream(stream.device_index()).synchronize();
  return stream;
}

class CudaGraphSession final : public GraphSession {
 public:
  explicit CudaGraphSession(const c10::Device& device)
      : stream_(StartAfterCurrent(device)), pool_(at::cuda::graph_pool_handle()) {}
  ~CudaGraphSession() override { stream_.synchronize(); }

  std::unique_ptr<CapturedGraph> Capture(const std::function<void()>& work) override {
    // A capture allocates from the graphs' pool only, and cannot reclaim
    // the regular pool's cached blocks when it runs short: hand those back
    // first (once a bucket).
    c10::cuda::CUDACachingAllocator::emptyCache();
    auto graph = std::make_unique<CudaGraph>();
    try {
#if TORCH_VERSION_MAJOR >= 2
      // Only this thread's calls can break the capture: the offload
      // engine's threads may use CUDA meanwhile, on their own streams.
      graph->graph().capture_begin(pool_, cudaStreamCaptureModeThreadLocal);
#else
      graph->graph().capture_begin(pool_);
#endif
      try {
        work();
      } catch (...) {
        graph->graph().capture_end();  // ends the stream's capture; throws for the invalidated graph
        throw;
      }
      graph->graph().capture_end();
    } catch (const std::exception& e) {
      capture_failed = true;
      STRATA_LOG(Error) << "rollout: capturing a decode step as a CUDA graph failed; this process decodes eagerly "
                           "from now on: "
                        << e.what();
      TORCH_CHECK(false, "generation.cuda_graphs: capturing a decode step failed (false decodes eagerly): ", e.what());
    }
    return graph;
  }

 private:
  c10::cuda::CUDAStream stream_;
  c10::cuda::CUDAStreamGuard on_stream_{stream_};
  decltype(at::cuda::graph_pool_handle()) pool_;  // MempoolId_t, whose namespace moved between versions
};

}  // namespace
#endif

std::unique_ptr<GraphSession> GraphSession::Begin(const c10::Device& device) {
  if (capture_failed) return nullptr;
#if STRATA_WITH_CUDA
  if (device.is_cuda()) return std::make_unique<CudaGraphSession>(device);
#endif
  (void)device;
  return nullptr;
}

}  // namespace strata::policies
