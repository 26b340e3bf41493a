#include "base/interrupt.h"

#include <atomic>

#include "absl/strings/str_cat.h"

namespace strata {
namespace {

std::atomic<bool> interrupt_requested{false};

}  // namespace

void RequestInterrupt() { interrupt_requested.store(true, std::memory_order_relaxed); }
void ClearInterrupt() { interrupt_requested.store(false, std::memory_order_relaxed); }
bool InterruptRequested() { return interrupt_requested.load(std::memory_order_relaxed); }

absl::Status CheckInterrupt(const char* where) {
  if (!InterruptRequested()) return absl::OkStatus();
  return absl::CancelledError(absl::StrCat("interrupted ", where, ": the job was cancelled"));
}

}  // namespace strata
