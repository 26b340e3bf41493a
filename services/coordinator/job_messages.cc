#include "services/coordinator/job_messages.h"

namespace strata::services {
namespace v1 = strata::v1;

strata::v1::JobState ToProtoState(JobState state) {
  switch (state) {
    case JobState::kQueued:
      return v1::QUEUED;
    case JobState::kRunning:
      return v1::RUNNING;
    case JobState::kSucceeded:
      return v1::SUCCEEDED;
    case JobState::kFailed:
      return v1::FAILED;
    case JobState::kCancelled:
      return v1::CANCELLED;
  }
  return v1::JOB_STATE_UNSPECIFIED;
}

void ToProto(const JobRecord& r, v1::Job* job) {
  job->set_id(r.id);
  job->set_state(ToProtoState(r.state));
  job->set_algorithm(r.algorithm);
  job->set_name(r.name);
  job->set_iteration(r.iteration);
  job->set_iterations(r.iterations);
  job->set_error_code(r.error_code);
  job->set_error_message(r.error_message);
  job->set_created_unix_ms(r.created_unix_ms);
  job->set_updated_unix_ms(r.updated_unix_ms);
  job->set_started_unix_ms(r.started_unix_ms);
  job->set_worker(r.worker);
  job->set_spec_yaml(r.spec_yaml);
  job->set_output_dir(r.output_dir);
  job->set_continues(r.continues());
  job->set_continued_by(r.continued_by);
}

}  // namespace strata::services
