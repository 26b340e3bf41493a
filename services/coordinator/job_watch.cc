#include "services/coordinator/job_watch.h"

#include <atomic>
#include <chrono>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "services/coordinator/job_messages.h"
#include "services/rpc/wire.h"

namespace strata::services {
namespace v1 = strata::v1;
namespace {

// The state a "state" event announces (nullopt for any other event, or
// JSON without a known state).
std::optional<JobState> AnnouncedState(const JobEventRecord& e, const nlohmann::json& j) {
  if (e.type != "state" || !j.is_object() || !j.contains("state") || !j["state"].is_string()) return std::nullopt;
  auto state = ParseJobState(j["state"].get<std::string>());
  return state.ok() ? std::optional<JobState>(*state) : std::nullopt;
}

// Streams a job's events: reads what the store has after the client's last event,
// writes them one by one, and when it has caught up parks until the job
// publishes more. Exactly one step (a read on the executor, a write, or
// parking) is in progress at a time, and that step owns the next one, so
// Finish is called once.
class WatchReactor final : public grpc::ServerWriteReactor<v1::JobEvent>, public ParkedWatcher {
 public:
  WatchReactor(const JobWatchContext& context, std::string job_id, std::string after,
               std::function<absl::Status()> may_see)
      : context_(context), job_id_(std::move(job_id)), last_(std::move(after)), may_see_(std::move(may_see)) {}

  void Read() {
    context_.executor.Submit([this] {
      if (cancelled_.load()) return Finish(grpc::Status(grpc::StatusCode::CANCELLED, "watch cancelled"));
      if (!allowed_) {
        if (absl::Status may = may_see_(); !may.ok()) return Finish(ToGrpcStatus(may));
        allowed_ = true;
      }
      auto events = context_.store.ReadEvents(job_id_, last_, 64, /*block_ms=*/0);
      if (!events.ok()) return Finish(ToGrpcStatus(events.status()));
      pending_ = std::move(*events);
      next_ = 0;
      if (!pending_.empty()) {
        reread_ = false;
        return WriteNext();
      }
      // Caught up: a terminal job has nothing more to say once its final
      // state event is out (writing it ends the stream).
      auto job = context_.store.Get(job_id_);
      if (!job.ok()) return Finish(ToGrpcStatus(job.status()));
      if (IsTerminal(job->state)) {
        auto last = context_.store.LastEvent(job_id_);
        if (!last.ok()) return Finish(ToGrpcStatus(last.status()));
        // Appended since the read above (the final state event, as a rule):
        // read it before deciding anything. Once: a client's after-id past
        // the newest event must not spin here.
        if (last->has_value() && (*last)->id != last_ && !reread_) {
          reread_ = true;
          return Read();
        }
        if (FinalEventIsOut(*last)) return Finish(grpc::Status::OK);
      }
      if (!context_.events.Park(job_id_, this)) Finish(grpc::Status(grpc::StatusCode::CANCELLED, "watch cancelled"));
    });
  }

  bool cancelled() const override { return cancelled_.load(); }

  void Wake() override { Read(); }

  void OnWriteDone(bool ok) override {
    if (!ok) return Finish(grpc::Status(grpc::StatusCode::CANCELLED, "client went away"));
    if (next_ < pending_.size()) return WriteNext();
    if (stop_after_write_) return Finish(grpc::Status::OK);
    Read();
  }

  void OnCancel() override {
    cancelled_.store(true);
    // If parked, nothing else will move this reactor: finish it here.
    if (context_.events.Unpark(job_id_, this)) Finish(grpc::Status(grpc::StatusCode::CANCELLED, "watch cancelled"));
  }

  void OnDone() override { delete this; }

 private:
  void WriteNext() {
    const JobEventRecord& e = pending_[next_++];
    last_ = e.id;
    event_.Clear();
    event_.set_id(e.id);
    event_.set_type(e.type);
    event_.set_json(e.json);
    const nlohmann::json j = nlohmann::json::parse(e.json, nullptr, false);
    if (j.is_object() && j.contains("iteration") && j["iteration"].is_number_integer()) {
      event_.set_iteration(j["iteration"].get<int64_t>());
    }
    if (const auto state = AnnouncedState(e, j)) {
      event_.set_state(ToProtoState(*state));
      if (IsTerminal(*state)) stop_after_write_ = true;
    }
    StartWrite(&event_);
  }

  // A job's end is recorded before its final state event is appended: a
  // watcher that catches up in between waits for that event (Publish, or
  // the scheduler's sweep of parked watchers, wakes it), so that the stream
  // does not end without the state it ended in. `last`, the job's newest
  // event, is the caller's newest too (Read checks): if it is a terminal
  // state, it was written (to this caller or, resuming, to an earlier
  // stream). The wait is bounded for a coordinator that died between the
  // two. (Before Read compared the ids, a final event appended between its
  // read and this check ended the stream unwritten.)
  bool FinalEventIsOut(const std::optional<JobEventRecord>& last) {
    if (last.has_value()) {
      const auto state = AnnouncedState(*last, nlohmann::json::parse(last->json, nullptr, false));
      if (state.has_value() && IsTerminal(*state)) return true;
    }
    const auto now = std::chrono::steady_clock::now();
    if (!terminal_seen_.has_value()) terminal_seen_ = now;
    return now - *terminal_seen_ >= std::chrono::seconds(5);
  }

  const JobWatchContext context_;
  const std::string job_id_;
  std::string last_;
  std::vector<JobEventRecord> pending_;
  size_t next_ = 0;
  v1::JobEvent event_;
  const std::function<absl::Status()> may_see_;
  bool allowed_ = false;  // may_see_ said yes (asked on the first read)
  std::optional<std::chrono::steady_clock::time_point> terminal_seen_;
  bool stop_after_write_ = false;
  bool reread_ = false;  // caught up, read again for an event newer than last_
  std::atomic<bool> cancelled_{false};
};

}  // namespace

grpc::ServerWriteReactor<v1::JobEvent>* WatchJobEvents(const JobWatchContext& context, const std::string& job_id,
                                                       const std::string& after_event_id, const absl::Status& refused,
                                                       std::function<absl::Status()> may_see) {
  auto* reactor = new WatchReactor(context, job_id, after_event_id, std::move(may_see));
  if (!refused.ok()) {
    reactor->Finish(ToGrpcStatus(refused));
  } else {
    reactor->Read();
  }
  return reactor;
}

}  // namespace strata::services
