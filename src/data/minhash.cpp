#include "data/minhash.h"

#include <algorithm>
#include <random>
#include <stdexcept>

#include "data/shard_format.h"
#include "data/text_filters.h"

namespace keel::data {

std::vector<uint64_t> shingle_set(std::string_view text, bool char_shingles, int size) {
  return shingle_set_of_normalized(normalize_text(text), char_shingles, size);
}

std::vector<uint64_t> shingle_set_of_normalized(std::string_view norm, bool char_shingles,
                                                int size) {
  std::vector<uint64_t> out;
  size = std::max(size, 1);
  if (char_shingles) {
    if (norm.size() <= static_cast<size_t>(size)) {
      if (!norm.empty()) out.push_back(xxh3(norm.data(), norm.size()));
    } else {
      for (size_t i = 0; i + size <= norm.size(); ++i) out.push_back(xxh3(norm.data() + i, size));
    }
  } else {
    std::vector<size_t> starts;  // word starts in `norm` (single spaces between words)
    for (size_t i = 0; i < norm.size(); ++i)
      if (i == 0 || norm[i - 1] == ' ') starts.push_back(i);
    size_t words = starts.size();
    starts.push_back(norm.size() + 1);
    if (words > 0) {
      size_t n = words <= static_cast<size_t>(size) ? 1 : words - size + 1;
      for (size_t w = 0; w < n; ++w) {
        size_t end = starts[std::min(w + size, words)] - 1;
        out.push_back(xxh3(norm.data() + starts[w], end - starts[w]));
      }
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

double exact_jaccard(const std::vector<uint64_t>& a, const std::vector<uint64_t>& b) {
  if (a.empty() && b.empty()) return 1.0;
  size_t i = 0, j = 0, inter = 0;
  while (i < a.size() && j < b.size()) {
    if (a[i] < b[j])
      ++i;
    else if (b[j] < a[i])
      ++j;
    else {
      ++inter;
      ++i;
      ++j;
    }
  }
  return static_cast<double>(inter) / static_cast<double>(a.size() + b.size() - inter);
}

MinHasher::MinHasher(const MinHashConfig& config) {
  if (config.num_perm <= 0) throw std::invalid_argument("num_perm must be positive");
  std::mt19937_64 rng(config.seed * 0x9E3779B97F4A7C15ull + 12345);
  for (int i = 0; i < config.num_perm; ++i) {
    a_.push_back(rng() | 1);  // multiply-shift hashing: odd multiplier, keep the high 32 bits
    b_.push_back(rng());
  }
}

std::vector<uint32_t> MinHasher::signature(const std::vector<uint64_t>& shingles) const {
  const size_t n = a_.size();
  std::vector<uint32_t> sig(n, UINT32_MAX);
  for (uint64_t h : shingles) {
    for (size_t i = 0; i < n; ++i) {
      uint32_t v = static_cast<uint32_t>((a_[i] * h + b_[i]) >> 32);
      sig[i] = std::min(sig[i], v);
    }
  }
  return sig;
}

double estimate_jaccard(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b) {
  if (a.empty() || a.size() != b.size()) return 0.0;
  size_t same = 0;
  for (size_t i = 0; i < a.size(); ++i) same += a[i] == b[i];
  return static_cast<double>(same) / static_cast<double>(a.size());
}

NearDuplicateIndex::NearDuplicateIndex(const MinHashConfig& config)
    : config_(config), rows_(config.bands > 0 ? config.num_perm / config.bands : 0) {
  if (config.bands <= 0 || rows_ <= 0 || config.num_perm % config.bands != 0)
    throw std::invalid_argument("num_perm must be a positive multiple of bands");
  tables_.resize(config.bands);
}

uint64_t NearDuplicateIndex::band_key(const std::vector<uint32_t>& sig, int band) const {
  return xxh3(sig.data() + static_cast<size_t>(band) * rows_, sizeof(uint32_t) * rows_);
}

int64_t NearDuplicateIndex::find(const std::vector<uint32_t>& signature) const {
  int64_t best = -1;
  double best_j = -1.0;
  std::vector<int64_t> seen;
  for (int band = 0; band < config_.bands; ++band) {
    auto it = tables_[band].find(band_key(signature, band));
    if (it == tables_[band].end()) continue;
    for (int64_t id : it->second) {
      if (std::find(seen.begin(), seen.end(), id) != seen.end()) continue;
      seen.push_back(id);
      ++checked_;
      double j = estimate_jaccard(signature, signatures_.at(id));
      if (j >= config_.threshold && j > best_j) {
        best = id;
        best_j = j;
      }
    }
  }
  return best;
}

void NearDuplicateIndex::insert(int64_t id, std::vector<uint32_t> signature) {
  for (int band = 0; band < config_.bands; ++band)
    tables_[band][band_key(signature, band)].push_back(id);
  signatures_.emplace(id, std::move(signature));
}

}  // namespace keel::data
