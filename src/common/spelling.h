// Near-miss matching for did-you-mean hints: a config key, a `--resume` value, a flag's choice.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace keel {

// Edit distance (insertions, deletions, substitutions).
size_t levenshtein(std::string_view a, std::string_view b);

// A typo budget that grows with the word: one edit for short words, about a third of a long one.
// A prefix of 3+ characters also counts ("optimizer" for optim, "warmup" for warmup_steps).
bool close_enough(const std::string& typed, const std::string& candidate);

// The candidate `typed` most likely meant, if any is close enough.
std::optional<std::string> closest_word(const std::string& typed,
                                        const std::vector<std::string>& candidates);

}  // namespace keel
