// Worker replies and coordinator requests as protobuf bytes, converted to
// the engine's types: the first byte picks the message.
#include "fuzz/fuzz_util.h"
#include "services/rpc/wire.h"
#include "strata/v1/worker.pb.h"

namespace v1 = strata::v1;
using strata::services::FromProto;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const void* bytes = data + 1;
  const int n = static_cast<int>(size - 1);
  switch (data[0] % 7) {
    case 0: {
      v1::RolloutResponse m;
      if (m.ParseFromArray(bytes, n)) {
        for (int i = 0; i < m.rollouts_size(); ++i) (void)FromProto(m.rollouts(i), "rollouts");
      }
      break;
    }
    case 1: {
      v1::ScoreRequest m;
      std::vector<strata::policies::Rollout> rollouts;
      strata::policies::ScoreRequest request;
      if (m.ParseFromArray(bytes, n)) (void)FromProto(m, &rollouts, &request);
      break;
    }
    case 2: {
      v1::ScoreResponse m;
      if (m.ParseFromArray(bytes, n)) (void)FromProto(m);
      break;
    }
    case 3: {
      v1::UpdateRequest m;
      if (m.ParseFromArray(bytes, n)) {
        auto update = FromProto(m);
        if (update.ok()) {
          // What converts in converts back to the same message.
          v1::UpdateRequest again;
          strata::services::ToProto(*update, &again);
          strata::fuzz::Check(FromProto(again).ok(), "update round trip");
        }
      }
      break;
    }
    case 4: {
      v1::TrainSftRequest m;
      if (m.ParseFromArray(bytes, n)) (void)FromProto(m);
      break;
    }
    case 5: {
      v1::PreferenceBatch m;
      if (m.ParseFromArray(bytes, n)) (void)FromProto(m);
      break;
    }
    default: {
      v1::Tensor m;
      if (m.ParseFromArray(bytes, n)) (void)FromProto(m, "tensor");
      break;
    }
  }
  return 0;
}
