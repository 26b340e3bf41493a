// CUDA graphs of the rollout engine's decode steps (decode_step.h): a
// step's kernels captured once and replayed with what its buffers hold.
// Only a CUDA build on a CUDA device captures; elsewhere there is no
// session and steps run eagerly.
#ifndef STRATA_POLICIES_ROLLOUT_CAPTURED_GRAPH_H_
#define STRATA_POLICIES_ROLLOUT_CAPTURED_GRAPH_H_

#include <c10/core/Device.h>

#include <functional>
#include <memory>

namespace strata::policies {

class CapturedGraph {
 public:
  virtual ~CapturedGraph() = default;
  // Launches the captured kernels on the current stream.
  virtual void Replay() = 0;
};

// The graphs of one rollout (one at a time a device, as a worker runs
// them). While the session lives, the calling thread's work runs on the
// device's rollout stream (capture cannot use the default one, and no
// other thread is handed this one), and its graphs share one memory pool.
class GraphSession {
 public:
  // Null where this build or `device` cannot capture, and in a process
  // where a capture has failed.
  static std::unique_ptr<GraphSession> Begin(const c10::Device& device);
  virtual ~GraphSession() = default;

  // Captures the kernels `work` launches without running them. `work` must
  // have run once on this session's stream first (libraries set up their
  // workspaces on the first call), and must keep nothing it allocates: the
  // graphs share their pool, so what one graph left there another
  // overwrites. A failed capture is an error naming generation.cuda_graphs.
  virtual std::unique_ptr<CapturedGraph> Capture(const std::function<void()>& work) = 0;
};

}  // namespace strata::policies

#endif  // STRATA_POLICIES_ROLLOUT_CAPTURED_GRAPH_H_
