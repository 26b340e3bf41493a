// A process-wide request to stop the operation in progress: a worker whose
// job was cancelled sets it, and long loops give up at their next safe
// point (each decoding step of generation, each layer of a training pass)
// with CANCELLED, instead of finishing a phase that nobody wants. One flag
// suffices: a worker process serves one job at a time.
#ifndef STRATA_BASE_INTERRUPT_H_
#define STRATA_BASE_INTERRUPT_H_

#include "absl/status/status.h"

namespace strata {

void RequestInterrupt();
void ClearInterrupt();
bool InterruptRequested();
// CANCELLED naming `where` if an interrupt is pending, else OK.
absl::Status CheckInterrupt(const char* where);

}  // namespace strata

#endif  // STRATA_BASE_INTERRUPT_H_
