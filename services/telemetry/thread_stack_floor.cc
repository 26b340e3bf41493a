// civetweb 1.15 (Debian's, under prometheus-cpp's Exposer) starts every
// thread with a fixed 100 KiB stack. glibc carves a process's static TLS out
// of each thread's stack and refuses (EINVAL) one too small to hold it, and
// strata's static TLS is ~105 KiB (OpenBLAS alone has 60 KiB), so the
// metrics endpoint could not start a thread. This definition in the
// executable takes precedence over libc's for the shared libraries it loads
// and gives a thread that asks for less than 1 MiB that much instead; a
// larger request is passed through unchanged. Stacks are mapped lazily, so
// the floor costs address space, not memory.
#include <dlfcn.h>
#include <pthread.h>

#include <algorithm>
#include <cstddef>

namespace {

constexpr size_t kStackFloorBytes = size_t{1} << 20;

using SetStackSize = int (*)(pthread_attr_t*, size_t);

}  // namespace

extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr, size_t size) {
  static const auto libc = reinterpret_cast<SetStackSize>(::dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  return libc(attr, std::max(size, kStackFloorBytes));
}

// Referenced by ServiceMetrics::Serve, so the linker always takes this file
// from the static library.
namespace strata::services {
int ThreadStackFloorBytes() { return static_cast<int>(kStackFloorBytes); }
}  // namespace strata::services
