#include "train/faults.h"

#include <unistd.h>
#include <chrono>
#include <cmath>
#include <csignal>
#include <limits>
#include <thread>

#include "common/error.h"
#include "common/log.h"

namespace keel::train {

std::vector<config::FaultSpec> faults_for_rank(const std::vector<config::FaultSpec>& faults,
                                               int rank, const std::string& host) {
  std::vector<config::FaultSpec> out;
  for (const auto& f : faults)
    if ((f.rank < 0 || f.rank == rank) && (f.host.empty() || f.host == host)) out.push_back(f);
  return out;
}

FaultInjector::FaultInjector(std::vector<config::FaultSpec> faults, int64_t grad_accum_steps,
                             int64_t vocab_size, uint64_t seed)
    : faults_(std::move(faults)),
      accum_(std::max<int64_t>(grad_accum_steps, 1)),
      vocab_(vocab_size),
      gen_(at::make_generator<at::CPUGeneratorImpl>(seed ^ 0xFA17ull)) {
  repeat_sets_.resize(faults_.size());
  for (size_t i = 0; i < faults_.size(); ++i) {
    splices_.emplace_back();
    if (faults_[i].kind != config::FaultKind::kSpliceData) continue;
    splices_.back() = data::ShardSet::open(faults_[i].path, "train");
    if (splices_.back()->meta().vocab_size > vocab_)
      throw ConfigError("faults[" + std::to_string(i) + "].path: " + faults_[i].path +
                        " has a vocabulary of " +
                        std::to_string(splices_.back()->meta().vocab_size) +
                        " tokens, more than model.vocab_size " + std::to_string(vocab_) +
                        "; HINT: prepare it with the run's tokenizer");
  }
}

bool FaultInjector::corrupt(data::Batch& batch, int64_t position) {
  bool done = false;
  for (size_t i = 0; i < faults_.size(); ++i) {
    const auto& f = faults_[i];
    if (!active(f, position / accum_)) continue;
    auto& tokens = batch.tokens;  // (B, T+1)
    if (f.kind == config::FaultKind::kSpliceData) {
      // Consecutive windows of the spliced dataset, from its start, wrapping around.
      const data::ShardSet& junk = *splices_[i];
      const int64_t B = tokens.size(0), T = tokens.size(1) - 1;
      const int64_t windows = std::max<int64_t>((junk.num_tokens() - 1) / T, 1);
      const int64_t first = (position - f.at_step * accum_) * B;
      auto host = torch::empty_like(tokens, tokens.options().device(torch::kCPU));
      for (int64_t b = 0; b < B; ++b)
        junk.read(((first + b) % windows) * T, T + 1, host.data_ptr<int64_t>() + b * (T + 1));
      tokens.copy_(host);
      done = true;
      continue;
    }
    if (f.kind == config::FaultKind::kRepeatData) {
      const int64_t step = position / accum_;
      if (position % accum_ != 0 || (step - f.at_step) % std::max<int64_t>(f.period, 1) != 0)
        continue;
      torch::Tensor& set = repeat_sets_[i];
      if (!set.defined()) {  // the documents' first sight is an ordinary one
        set = tokens.to(torch::kCPU).clone();
      } else if (set.sizes() == tokens.sizes()) {
        tokens.copy_(set);
        done = true;
      }
      continue;
    }
    if (f.kind != config::FaultKind::kCorruptBatch) continue;
    if (f.mode == config::CorruptMode::kRepeatToken) {
      tokens.fill_(torch::randint(vocab_, {1}, gen_, torch::kInt64).item<int64_t>());
    } else if (f.mode == config::CorruptMode::kShuffled) {
      for (int64_t b = 0; b < tokens.size(0); ++b)
        tokens[b].copy_(
            tokens[b].index_select(0, torch::randperm(tokens.size(1), gen_, torch::kInt64)));
    } else {  // random_tokens (the default mode)
      tokens.copy_(torch::randint(vocab_, tokens.sizes(), gen_, torch::kInt64));
    }
    done = true;
  }
  return done;
}

double FaultInjector::lr_multiplier(int64_t iteration) const {
  double m = 1.0;
  for (const auto& f : faults_)
    if (f.kind == config::FaultKind::kLrSpike && active(f, iteration)) m *= f.factor;
  return m;
}

double FaultInjector::gradient_growth(int64_t iteration) const {
  double m = 1.0;
  for (const auto& f : faults_)
    if (f.kind == config::FaultKind::kGradGrowth && active(f, iteration))
      m *= std::pow(f.factor, static_cast<double>(iteration - f.at_step + 1) /
                                  static_cast<double>(std::max<int64_t>(f.steps, 1)));
  return m;
}

double FaultInjector::gradient_corruption(int64_t iteration, bool replay) const {
  double m = 1.0;
  for (const auto& f : faults_)
    if (f.kind == config::FaultKind::kCorruptGrad && active(f, iteration) &&
        (!replay || f.persistent))
      m *= f.factor == 1.0 ? config::kCorruptGradFactor : f.factor;
  return m;
}

void FaultInjector::after_backward(int64_t iteration, const std::vector<torch::Tensor>& params,
                                   bool replay) const {
  for (const auto& f : faults_) {
    if (replay && f.kind != config::FaultKind::kNanGrad) continue;
    if (f.kind == config::FaultKind::kCrash && iteration == f.at_step) {
      log::warn("faults", "crash fault at iteration {}: killing the process", iteration);
      ::kill(::getpid(), SIGKILL);
    }
    if (f.kind == config::FaultKind::kHang && iteration == f.at_step) {
      // Alive but silent, as a rank stuck in a kernel or a stopped process: no collective, no
      // answer to SIGTERM (its handler only sets a flag); SIGKILL ends it.
      log::warn("faults", "hang fault at iteration {}: this rank stops answering{}", iteration,
                f.seconds > 0 ? fmt::format(" for {} s", f.seconds) : std::string());
      const auto until = std::chrono::steady_clock::now() +
                         std::chrono::milliseconds(static_cast<int64_t>(f.seconds * 1000));
      while (f.seconds <= 0 || std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (f.kind == config::FaultKind::kSlowRank && active(f, iteration))  // a slower machine
      std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(f.seconds * 1e6)));
    if (f.kind == config::FaultKind::kNanGrad && active(f, iteration)) {
      for (const auto& p : params)
        if (p.grad().defined()) {
          p.grad().fill_(std::numeric_limits<float>::quiet_NaN());
          break;
        }
    }
  }
}

void FaultInjector::after_update(int64_t iteration,
                                 const std::vector<torch::Tensor>& weights) const {
  for (const auto& f : faults_)
    if (f.kind == config::FaultKind::kFlipBit && active(f, iteration) && !weights.empty() &&
        weights.front().scalar_type() == torch::kFloat) {
      torch::NoGradGuard no_grad;
      log::warn("faults", "flip_bit fault at iteration {}: one bit of a weight flips", iteration);
      // Mantissa bit 16: the weight moves by 2^-7 of itself at most. (Its lowest bit can be
      // rounded away by the next update, leaving nothing to find.)
      weights.front().detach().view({-1}).view(torch::kInt32).narrow(0, 0, 1).bitwise_xor_(1 << 16);
    }
}

bool FaultInjector::touches_gradients(int64_t iteration) const {
  for (const auto& f : faults_)
    if (f.kind == config::FaultKind::kNanGrad && active(f, iteration)) return true;
  return false;
}

}  // namespace keel::train
