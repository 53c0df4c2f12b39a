// What a trainer changes in the process and puts back when it ends: its threads, allocator, GEMM
// and determinism settings, and the SIGTERM/SIGINT handling of the training thread.
//
// Owns: the settings as they were before the trainer changed them (ProcessSettings) and the
// signal-catching thread with the mask it replaced (StopSignals). Called by: setup.cpp (build(),
// first, before it changes anything; the trainer's end destroys them, which puts things back).
// Writes: nothing (a signal goes to the handler it was given, which sets the loop's stop flag).
// Saves: nothing: process state, set again at each start.
#pragma once

#include <pthread.h>

#include <condition_variable>
#include <csignal>
#include <mutex>
#include <thread>

#include "model/fused_ops.h"

namespace keel::train {

// Process-wide settings a trainer changes in setup() (intra-op threads, the host allocator, the
// CPU GEMM, deterministic algorithms, the SIGTERM/SIGINT handlers), put back as they were when the
// trainer ends, so two trainers in one process (tests, tools) do not leak into each other.
class ProcessSettings {
 public:
  ProcessSettings();
  ~ProcessSettings();
  ProcessSettings(const ProcessSettings&) = delete;
  ProcessSettings& operator=(const ProcessSettings&) = delete;

 private:
  int threads_;
  bool caching_allocator_;
  model::CpuMatmul cpu_matmul_;
  bool deterministic_;
  struct sigaction sigterm_ {};
  struct sigaction sigint_ {};
};

// SIGTERM/SIGINT only set the stop flag the step loop reads, and they are taken on a thread of
// their own: blocked on the training thread (and on the compute threads it starts later). A signal
// that interrupted a oneDNN JIT GEMM on the training thread was seen to corrupt the heap (its
// sgemm then freed a clobbered workspace pointer, in 2-rank runs under load), so the thread that
// computes is never the one interrupted. The mask is restored when the trainer ends.
class StopSignals {
 public:
  explicit StopSignals(void (*handler)(int));
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  sigset_t previous_mask_{};
  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::thread catcher_;
};

}  // namespace keel::train
