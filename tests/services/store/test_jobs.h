// A job record as the store tests create them.
#ifndef STRATA_TESTS_SERVICES_STORE_TEST_JOBS_H_
#define STRATA_TESTS_SERVICES_STORE_TEST_JOBS_H_

#include <string>

#include "gtest/gtest.h"
#include "services/store/job_store.h"

namespace strata::services {

inline JobRecord NewJob(const std::string& name, const std::string& request_id = "") {
  JobRecord job;
  job.algorithm = "remax";
  job.name = name;
  job.spec_yaml = "algorithm: remax\nname: " + name + "\n";
  job.output_dir = "/tmp/out/" + name;
  job.iterations = 10;
  job.request_id = request_id;
  return job;
}

// The new job's id ("" after a failed expectation).
inline std::string CreateJob(JobStore& store, const std::string& name) {
  auto job = store.Create(NewJob(name), nullptr);
  EXPECT_TRUE(job.ok()) << job.status();
  return job.ok() ? job->id : std::string();
}

}  // namespace strata::services

#endif  // STRATA_TESTS_SERVICES_STORE_TEST_JOBS_H_
