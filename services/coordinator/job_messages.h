// A stored job as the Coordinator API shows it.
#ifndef STRATA_SERVICES_COORDINATOR_JOB_MESSAGES_H_
#define STRATA_SERVICES_COORDINATOR_JOB_MESSAGES_H_

#include "services/store/job_store.h"
#include "strata/v1/coordinator.pb.h"

namespace strata::services {

void ToProto(const JobRecord& record, strata::v1::Job* job);
strata::v1::JobState ToProtoState(JobState state);

}  // namespace strata::services

#endif  // STRATA_SERVICES_COORDINATOR_JOB_MESSAGES_H_
