// What activation checkpointing and the chunked cross-entropy save, measured with the caching
// host allocator's counters (blocks of 1 MiB and more) on one forward + backward of a model:
//   kept   the bytes the forward leaves for the backward pass (activations, logits)
//   peak   the most in use during forward + backward, above what was in use before the step
//   plan   what the memory plan (model/memory_plan.h) says that peak is: the activations and the
//          larger of the loss's tensors and a rebuilt block (the weights were there before; the
//          weights' gradients come after the peak here)
//   ms     the step's wall time (median of --reps, after one warm-up)
// Every variant computes the same gradients (tests/unit/model/{recompute,chunked_loss}_test.cpp).
//
//   keel_bench_memory [--threads 2] [--reps 3] [--tokens 4096] [--seq 1024] [--vocab 50304]
//                     [--d-model 256] [--layers 4]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/host_allocator.h"
#include "model/fused_ops.h"
#include "model/memory_plan.h"
#include "model/transformer.h"

namespace {

using Clock = std::chrono::steady_clock;
using keel::config::ActivationCheckpointing;
using keel::config::Switch;

struct Figures {
  double kept_mib, peak_mib, ms;
};

Figures measure(keel::config::ModelConfig c, int64_t batch, int reps) {
  torch::manual_seed(1);
  keel::model::Transformer m(c);
  m->train();
  const auto tokens = torch::randint(0, c.vocab_size, {batch, c.seq_len + 1});
  const auto inputs = tokens.slice(1, 0, -1), targets = tokens.slice(1, 1);
  std::vector<double> times;
  Figures f{0, 0, 0};
  for (int r = 0; r <= reps; ++r) {
    m->zero_grad();
    const int64_t before = keel::host_allocator_stats().in_use_bytes;
    keel::reset_host_peak_in_use();
    const auto t0 = Clock::now();
    auto out = m->loss(inputs, targets);
    const int64_t kept = keel::host_allocator_stats().in_use_bytes - before;
    out.loss.backward();
    out = {};
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    const int64_t peak = keel::host_allocator_stats().peak_in_use_bytes - before;
    if (r == 0) continue;  // warm-up: the allocator's cache fills
    times.push_back(ms);
    f.kept_mib = kept / 1048576.0;
    f.peak_mib = peak / 1048576.0;
  }
  std::sort(times.begin(), times.end());
  f.ms = times[times.size() / 2];
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, reps = 3;
  int64_t tokens = 4096, seq = 1024, vocab = 50304, d_model = 256, layers = 4;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const int64_t v = std::atoll(argv[i + 1]);
    if (flag == "--threads")
      threads = static_cast<int>(v);
    else if (flag == "--reps")
      reps = static_cast<int>(v);
    else if (flag == "--tokens")
      tokens = v;
    else if (flag == "--seq")
      seq = v;
    else if (flag == "--vocab")
      vocab = v;
    else if (flag == "--d-model")
      d_model = v;
    else if (flag == "--layers")
      layers = v;
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  at::set_num_threads(threads);
  keel::model::set_cpu_matmul(keel::model::CpuMatmul::kOneDnn);
  keel::install_caching_host_allocator(size_t{64} << 30);  // keep every freed block: no refaults
  keel::config::ModelConfig c;
  c.vocab_size = vocab;
  c.d_model = d_model;
  c.n_layers = layers;
  c.n_heads = std::max<int64_t>(d_model / 64, 1);
  c.seq_len = seq;
  const int64_t batch = std::max<int64_t>(tokens / seq, 1);
  std::printf("llama d_model %lld, %lld layers, vocab %lld, %lld x %lld tokens, %d threads\n",
              static_cast<long long>(d_model), static_cast<long long>(layers),
              static_cast<long long>(vocab), static_cast<long long>(batch),
              static_cast<long long>(seq), threads);
  std::printf("logits of the step in fp32: %.1f MiB\n\n", batch * seq * vocab * 4 / 1048576.0);
  std::printf(
      "| activation_checkpointing | chunked_loss | kept MiB | peak MiB | plan MiB | plan/peak | "
      "step ms |\n");
  std::printf("|---|---|---:|---:|---:|---:|---:|\n");
  for (auto ac : {ActivationCheckpointing::kNone, ActivationCheckpointing::kSelective,
                  ActivationCheckpointing::kFull}) {
    for (auto chunked : {Switch::kOff, Switch::kOn}) {
      c.activation_checkpointing = ac;
      c.chunked_loss = chunked;
      const Figures f = measure(c, batch, reps);
      keel::config::Config run;
      run.model = c;
      run.data.micro_batch_size = batch;
      keel::model::MemoryPlanOptions options;
      options.cuda = false;
      const auto plan = keel::model::plan_memory(run, options);
      const double planned = (plan.activations + plan.transient()) / 1048576.0;
      std::printf("| %s | %s | %.1f | %.1f | %.1f | %.2f | %.0f |\n",
                  std::string(keel::config::name_of(ac)).c_str(),
                  std::string(keel::config::name_of(chunked)).c_str(), f.kept_mib, f.peak_mib,
                  planned, planned / f.peak_mib, f.ms);
      std::fflush(stdout);
    }
  }
  return 0;
}
