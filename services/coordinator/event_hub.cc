#include "services/coordinator/event_hub.h"

#include <vector>

#include "base/log.h"

namespace strata::services {

void EventHub::Publish(const std::string& job_id, const std::string& type, const std::string& json) {
  auto appended = store_.AppendEvent(job_id, type, json);
  if (!appended.ok()) STRATA_LOG(Warning) << "event for " << job_id << " not recorded: " << appended.status();
  Wake(job_id);
}

bool EventHub::Park(const std::string& job_id, ParkedWatcher* watcher) {
  std::lock_guard<std::mutex> lock(mu_);
  // OnCancel unparks under this lock: checking here closes the window.
  if (watcher->cancelled()) return false;
  parked_.emplace(job_id, watcher);
  return true;
}

bool EventHub::Unpark(const std::string& job_id, ParkedWatcher* watcher) {
  std::lock_guard<std::mutex> lock(mu_);
  auto [begin, end] = parked_.equal_range(job_id);
  for (auto it = begin; it != end; ++it) {
    if (it->second == watcher) {
      parked_.erase(it);
      return true;
    }
  }
  return false;
}

void EventHub::Wake(const std::string& job_id) {
  std::vector<ParkedWatcher*> woken;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto [begin, end] = parked_.equal_range(job_id);
    for (auto it = begin; it != end; ++it) woken.push_back(it->second);
    parked_.erase(begin, end);
  }
  for (ParkedWatcher* watcher : woken) watcher->Wake();
}

void EventHub::WakeAll() {
  std::multimap<std::string, ParkedWatcher*> woken;
  {
    std::lock_guard<std::mutex> lock(mu_);
    woken.swap(parked_);
  }
  for (auto& [id, watcher] : woken) watcher->Wake();
}

}  // namespace strata::services
