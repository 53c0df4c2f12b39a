#include "train/faults.h"

#include <unistd.h>
#include <csignal>
#include <limits>

#include "common/log.h"

namespace keel::train {

FaultInjector::FaultInjector(std::vector<config::FaultSpec> faults, int64_t grad_accum_steps,
                             int64_t vocab_size, uint64_t seed)
    : faults_(std::move(faults)),
      accum_(std::max<int64_t>(grad_accum_steps, 1)),
      vocab_(vocab_size),
      gen_(at::make_generator<at::CPUGeneratorImpl>(seed ^ 0xFA17ull)) {}

bool FaultInjector::corrupt(data::Batch& batch, int64_t position) {
  bool done = false;
  for (const auto& f : faults_) {
    if (f.kind != "corrupt_batch" || !active(f, position / accum_)) continue;
    auto& tokens = batch.tokens;
    if (f.mode == "repeat_token") {
      tokens.fill_(torch::randint(vocab_, {1}, gen_, torch::kInt64).item<int64_t>());
    } else if (f.mode == "shuffled") {
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
    if (f.kind == "lr_spike" && active(f, iteration)) m *= f.factor;
  return m;
}

void FaultInjector::after_backward(int64_t iteration,
                                   const std::vector<torch::Tensor>& params) const {
  for (const auto& f : faults_) {
    if (f.kind == "crash" && iteration == f.at_step) {
      log::warn("faults", "crash fault at iteration {}: killing the process", iteration);
      ::kill(::getpid(), SIGKILL);
    }
    if (f.kind == "nan_grad" && active(f, iteration)) {
      for (const auto& p : params)
        if (p.grad().defined()) {
          p.grad().fill_(std::numeric_limits<float>::quiet_NaN());
          break;
        }
    }
  }
}

}  // namespace keel::train
