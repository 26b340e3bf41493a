#include "policies/rollout/captured_graph.h"

#if STRATA_WITH_CUDA
// libtorch 1.13's and 2.x's common API (capture_begin(pool), capture_end,
// replay, graph_pool_handle, pool streams), and 2.x's capture modes.
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/version.h>
#endif

namespace strata::policies {

#if STRATA_WITH_CUDA
namespace {

class CudaGraph final : public CapturedGraph {
 public:
  void Replay() override { graph_.replay(); }
  at::cuda::CUDAGraph& graph() { return graph_; }

 private:
  at::cuda::CUDAGraph graph_;
};

// A side stream, once what the current stream has queued is done (once a
// rollout: the waits that order streams are not worth their code here).
c10::cuda::CUDAStream StartAfterCurrent(const c10::Device& device) {
  c10::cuda::getCurrentCUDAStream(device.index()).synchronize();
  return c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index());
}

class CudaGraphSession final : public GraphSession {
 public:
  explicit CudaGraphSession(const c10::Device& device)
      : stream_(StartAfterCurrent(device)), pool_(at::cuda::graph_pool_handle()) {}
  ~CudaGraphSession() override { stream_.synchronize(); }

  std::unique_ptr<CapturedGraph> Capture(const std::function<void()>& work) override {
    auto graph = std::make_unique<CudaGraph>();
#if TORCH_VERSION_MAJOR >= 2
    // Only this thread's calls can break the capture: the offload engine's
    // threads may use CUDA meanwhile.
    graph->graph().capture_begin(pool_, cudaStreamCaptureModeThreadLocal);
#else
    graph->graph().capture_begin(pool_);
#endif
    try {
      work();
    } catch (...) {
      // End the capture, so the stream is usable and the error is the work's.
      try {
        graph->graph().capture_end();
      } catch (...) {
      }
      throw;
    }
    graph->graph().capture_end();
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
#if STRATA_WITH_CUDA
  if (device.is_cuda()) return std::make_unique<CudaGraphSession>(device);
#endif
  (void)device;
  return nullptr;
}

}  // namespace strata::policies
