// The seed's pre-launch checklist (§6.3 of the article keel comes from), walked for one config:
// for each item, what this config (and the data it points at) does about it. `keel validate`
// prints it; an item marked kWarn is a setting the checklist advises against, kOff a defence that
// is switched off. Neither fails validation: they are the person's call, made knowingly.
#pragma once

#include <string>
#include <vector>

#include "cli/rehearse.h"
#include "config/schema.h"

namespace keel::cli {

struct ChecklistItem {
  enum class Status { kOk, kWarn, kOff, kNotApplicable };
  std::string item;  // the checklist's words, e.g. "gradient clipping"
  Status status = Status::kOk;
  std::string what;  // what this config does, with the keys that decide it
};

// `parameters`: the model's parameter count (for the warmup advice); `rehearsal`: what
// `keel validate --rehearse` found, when it ran.
std::vector<ChecklistItem> walk_checklist(const config::Config& cfg, int64_t parameters,
                                          const Rehearsal* rehearsal = nullptr);

// "checklist: [ok]   optimizer: ..." lines.
std::string format_checklist(const std::vector<ChecklistItem>& items);

}  // namespace keel::cli
