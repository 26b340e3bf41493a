#include "base/engine_counters.h"

namespace strata {

EngineCounters& GlobalEngineCounters() {
  static EngineCounters counters;
  return counters;
}

}  // namespace strata
