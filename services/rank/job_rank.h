// One rank's part of a job: its models (a WorkerGroup), the job's data read
// and tokenized where the rank runs, its shard of every global batch, and
// the algorithm's state between phases. The driver (RunJob: the
// coordinator, or `strata train`) sends the same PhaseRequest to every rank
// of the gang and gets scalars back; prompts, rollouts, scores, advantages
// and weights never leave the ranks.
#ifndef STRATA_SERVICES_RANK_JOB_RANK_H_
#define STRATA_SERVICES_RANK_JOB_RANK_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "policies/dist/process_group.h"
#include "policies/job/job_spec.h"
#include "policies/rl/rl_algorithms.h"
#include "policies/rl/worker_group.h"
#include "policies/tokenizer/tokenizer.h"
#include "services/phase/phase.h"
#include "services/rank/job_examples.h"
#include "services/rank/local_worker_group.h"
#include "services/rank/metrics_log.h"
#include "services/rank/run_checkpoint.h"

namespace strata::services {

struct JobRankOptions {
  // One JSON object per iteration goes here (rank 0); "" = <output.dir>/metrics.jsonl.
  std::string metrics_path;
  // Names this run in its checkpoints (the service uses the job id).
  std::string run_id;
  // Other runs whose checkpoints this one may resume: the ended jobs it
  // continues.
  std::vector<std::string> resumable_run_ids;
};

class JobRank {
 public:
  // Reads and tokenizes the job's data and checks what its loop will need
  // (an eval rule); errors name the spec key or file. `models` and `gang`
  // must outlive the rank. The gang may not be larger than the batch.
  static absl::StatusOr<std::unique_ptr<JobRank>> Create(const policies::JobSpec& spec, LocalWorkerGroup& models,
                                                         const policies::Tokenizer& tokenizer,
                                                         policies::ProcessGroup& gang, JobRankOptions options);
  ~JobRank();

  // Runs one phase; INVALID_ARGUMENT for an unknown one.
  absl::StatusOr<PhaseReply> Run(const PhaseRequest& request);

  // The prompt rows of iteration `it` this rank holds, with their indices in
  // the global batch: row i goes to rank i mod N.
  std::vector<size_t> ShardOf(int64_t iteration, std::vector<int64_t>* batch_index) const;

 private:
  JobRank(const policies::JobSpec& spec, LocalWorkerGroup& models, const policies::Tokenizer& tokenizer,
          policies::ProcessGroup& gang, JobRankOptions options);
  absl::StatusOr<PhaseReply> FindCheckpoint(const PhaseRequest& request);
  absl::Status Start(const PhaseRequest& request);
  absl::StatusOr<policies::Metrics> Train(int64_t iteration);
  absl::StatusOr<policies::Metrics> Evaluate();
  absl::StatusOr<PhaseReply> Commit(const PhaseRequest& request);

  const policies::JobSpec spec_;
  LocalWorkerGroup& models_;
  const policies::Tokenizer& tokenizer_;
  policies::ProcessGroup& gang_;
  const JobRankOptions options_;
  MetricsLog metrics_;  // rank 0's
  RunCheckpoints checkpoints_;
  std::unique_ptr<policies::JobData> data_;
  bool evaluates_ = false;                    // RL: eval.every and eval prompts
  std::unique_ptr<RewardSources> eval_rule_;  // eval.rule's, when set
  std::unique_ptr<policies::RlAlgorithm> algorithm_;
};

}  // namespace strata::services

#endif  // STRATA_SERVICES_RANK_JOB_RANK_H_
