// Early returns for absl::Status and absl::StatusOr, the one pair every
// component uses instead of hand-written `if (!s.ok()) return s;`.
//
//   STRATA_RETURN_IF_ERROR(store->Flush());
//   STRATA_ASSIGN_OR_RETURN(auto text, ReadFileToString(path));
//   STRATA_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
//
// The expression is evaluated once. ASSIGN_OR_RETURN moves the value out of
// the StatusOr into the declaration (or assigns it to an existing lvalue).
#ifndef STRATA_BASE_STATUS_MACROS_H_
#define STRATA_BASE_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define STRATA_RETURN_IF_ERROR(expr)                                                         \
  do {                                                                                       \
    if (::absl::Status strata_status_ = (expr); !strata_status_.ok()) return strata_status_; \
  } while (false)

#define STRATA_STATUS_CONCAT_INNER_(a, b) a##b
#define STRATA_STATUS_CONCAT_(a, b) STRATA_STATUS_CONCAT_INNER_(a, b)

#define STRATA_ASSIGN_OR_RETURN(lhs, expr) \
  STRATA_ASSIGN_OR_RETURN_IMPL_(STRATA_STATUS_CONCAT_(strata_statusor_, __LINE__), lhs, expr)

#define STRATA_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                  \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = *std::move(statusor)

#endif  // STRATA_BASE_STATUS_MACROS_H_
