#include "train/process_settings.h"

#include <torch/torch.h>

#include "common/host_allocator.h"

namespace keel::train {

StopSignals::StopSignals(void (*handler)(int)) {
  std::signal(SIGTERM, handler);
  std::signal(SIGINT, handler);
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, &previous_mask_);
  catcher_ = std::thread([this, stop] {  // the one thread of ours the signals may interrupt
    pthread_sigmask(SIG_UNBLOCK, &stop, nullptr);
    std::unique_lock<std::mutex> lock(mutex_);
    done_cv_.wait(lock, [this] { return done_; });
  });
}

StopSignals::~StopSignals() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done_ = true;
  }
  done_cv_.notify_all();
  catcher_.join();
  pthread_sigmask(SIG_SETMASK, &previous_mask_, nullptr);
}

ProcessSettings::ProcessSettings()
    : threads_(at::get_num_threads()),
      caching_allocator_(caching_host_allocator_installed()),
      cpu_matmul_(model::cpu_matmul()),
      deterministic_(at::globalContext().deterministicAlgorithms()) {
  sigaction(SIGTERM, nullptr, &sigterm_);
  sigaction(SIGINT, nullptr, &sigint_);
}

ProcessSettings::~ProcessSettings() {
  sigaction(SIGTERM, &sigterm_, nullptr);
  sigaction(SIGINT, &sigint_, nullptr);
  at::globalContext().setDeterministicAlgorithms(deterministic_, false);
  model::set_cpu_matmul(cpu_matmul_);
  if (caching_allocator_ && !caching_host_allocator_installed())
    install_caching_host_allocator(default_host_cache_limit());
  if (!caching_allocator_ && caching_host_allocator_installed()) restore_default_host_allocator();
  if (at::get_num_threads() != threads_) at::set_num_threads(threads_);
}

}  // namespace keel::train
