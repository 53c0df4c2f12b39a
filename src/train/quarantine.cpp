#include "train/quarantine.h"

#include <algorithm>
#include <cmath>

#include "common/quarantine_reason.h"
#include "monitor/json_record.h"

namespace keel::train {

void Quarantine::record(int64_t id, const TrainCounters& at, const std::string& reason,
                        std::optional<double> loss, const nlohmann::json& extra) {
  if (!file_ || !since_stable_.insert(id).second) return;  // on record already
  monitor::JsonRecord rec;
  rec.add("id", id).add("step", at.step).add("iteration", at.iteration);
  rec.add("reason", reason);
  if (loss) rec.add("loss", std::isfinite(*loss) ? nlohmann::json(*loss) : nlohmann::json(nullptr));
  const nlohmann::json where = data_->locate(id);  // a named json: items() refers to it
  for (auto& [key, value] : where.items()) rec.add(key, value);
  for (auto& [key, value] : extra.items()) rec.add(key, value);
  file_->write(rec);
}

nlohmann::json Quarantine::record_screened(std::vector<std::pair<double, int64_t>> masked,
                                           const TrainCounters& at, int64_t top_k) {
  std::sort(masked.rbegin(), masked.rend());
  nlohmann::json named = nlohmann::json::array();
  for (const auto& [loss, id] : masked) {
    record(id, at, name_of(QuarantineReason::kScreen), loss);
    if (named.size() < static_cast<size_t>(std::max<int64_t>(top_k, 1)))
      named.push_back({{"id", id}, {"loss", loss}});
  }
  return named;
}

}  // namespace keel::train
