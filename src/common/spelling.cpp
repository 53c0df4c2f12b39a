#include "common/spelling.h"

#include <algorithm>

namespace keel {

size_t levenshtein(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

bool close_enough(const std::string& typed, const std::string& candidate) {
  const size_t limit = typed.size() <= 3 ? 1 : std::max<size_t>(2, typed.size() / 3);
  if (levenshtein(typed, candidate) <= limit) return true;
  const auto& shorter = typed.size() < candidate.size() ? typed : candidate;
  const auto& longer = typed.size() < candidate.size() ? candidate : typed;
  return shorter.size() >= 3 && longer.starts_with(shorter);
}

std::optional<std::string> closest_word(const std::string& typed,
                                        const std::vector<std::string>& candidates) {
  const std::string* best = nullptr;
  for (const auto& c : candidates) {
    if (!close_enough(typed, c)) continue;
    if (!best || levenshtein(typed, c) < levenshtein(typed, *best)) best = &c;
  }
  if (!best) return std::nullopt;
  return *best;
}

}  // namespace keel
