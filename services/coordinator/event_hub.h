// A job's events on their way to watchers: Publish appends an event to the
// store and wakes the job's parked watchers, which then read what is new.
// Watchers park here only once they have caught up with the store, so the
// store stays the one record of what a job said.
#ifndef STRATA_SERVICES_COORDINATOR_EVENT_HUB_H_
#define STRATA_SERVICES_COORDINATOR_EVENT_HUB_H_

#include <map>
#include <mutex>
#include <string>

#include "services/store/job_store.h"

namespace strata::services {

// A watcher waiting for its job's next event.
class ParkedWatcher {
 public:
  virtual ~ParkedWatcher() = default;
  virtual bool cancelled() const = 0;
  // Called once per parking, outside the hub's lock; the watcher reads on.
  virtual void Wake() = 0;
};

class EventHub {
 public:
  explicit EventHub(JobStore& store) : store_(store) {}

  // Appends {type, json} to the job's events and wakes its watchers. An
  // event the store refuses is logged: the job goes on without it.
  void Publish(const std::string& job_id, const std::string& type, const std::string& json);

  // False, parking nothing, for a watcher already cancelled: a cancel that
  // came after it last looked found nothing parked to finish.
  bool Park(const std::string& job_id, ParkedWatcher* watcher);
  // True when the watcher was parked (and now is not).
  bool Unpark(const std::string& job_id, ParkedWatcher* watcher);
  void Wake(const std::string& job_id);
  // Lets parked watchers notice jobs that ended without a new event (a
  // coordinator that died between recording an end and announcing it).
  void WakeAll();

 private:
  JobStore& store_;
  std::mutex mu_;
  std::multimap<std::string, ParkedWatcher*> parked_;
};

}  // namespace strata::services

#endif  // STRATA_SERVICES_COORDINATOR_EVENT_HUB_H_
